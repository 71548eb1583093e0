package cli

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/shellword"
	"github.com/muster-dev/muster/internal/store"
)

func newInitCmd(env *Env) *cobra.Command {
	var (
		dir, name, td, operator, storeURL   string
		custodyURI, pkcs11Module, pkcs11PIN string
		out                                 output
	)
	cmd := &cobra.Command{
		Use: "init --data DIR",
		Example: `  muster init --data /var/lib/muster/authority --name prod
  muster init --data ./authority --store 'postgres://muster@db.internal:5432/muster' -o json`,
		Short: "Create an authority: its CA hierarchy, storage key, bootstrap PSK and first operator identity",
		Long: `init creates a new authority in DIR: a root CA with bootstrap, server, agent
and admin intermediates and a policy signing certificate (ECDSA P-256), the
storage key that encrypts secrets at rest, the embedded SQLite store, the
first bootstrap PSK, and an operator identity (DIR/operator.pem).

It refuses a DIR that already holds an authority or any other file, and
leaves DIR untouched when anything fails. An existing empty DIR (systemd's
StateDirectory=, a Kubernetes volume) is filled in place and made 0700.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			if dir == "" {
				return fmt.Errorf("init: --data DIR is required")
			}
			o := datadir.InitOptions{
				Dir: datadir.Dir(dir), Name: name, TrustDomain: td, OperatorName: operator, Now: time.Now(),
			}
			if storeURL != "" {
				abs, err := storeAbsolute(storeURL)
				if err != nil {
					return fmt.Errorf("init: %w", err)
				}
				storeURL = abs
				o.OpenStore = func(ctx context.Context) (store.Store, error) { return openStore(ctx, storeURL) }
				o.StoreURL = storeURLWithoutPassword(storeURL)
			}
			ta := readTokenAccess(env, pkcs11Module, pkcs11PIN)
			token, err := initCustody(&o, custodyURI, ta.module, ta.pinFile)
			if err != nil {
				return fmt.Errorf("init: %w", err)
			}
			if token != nil {
				defer token.Close()
			}
			res, err := datadir.Init(cmd.Context(), o)
			if err != nil {
				return fmt.Errorf("init: %w", err)
			}
			if storeURL != "" {
				res.StoreURL = storeURLWithoutPassword(storeURL)
			}
			return printInit(env, out, res)
		},
	}
	cmd.Flags().StringVar(&dir, "data", "", "data directory to create (must not exist or be empty)")
	cmd.Flags().StringVar(&name, "name", "muster", "authority name; the authority ID is NAME-<first 6 hex of the root fingerprint>")
	cmd.Flags().StringVar(&td, "trust-domain", "", "SPIFFE trust domain (default: the authority ID)")
	cmd.Flags().StringVar(&operator, "operator", "admin", "name of the first operator identity")
	cmd.Flags().StringVar(&storeURL, "store", "", "an empty external store for the authority's records, postgres://… (default: the embedded SQLite file DIR/muster.db)")
	cmd.Flags().StringVar(&custodyURI, "custody", "sealed", "where the CA intermediates' and task signers' keys are made: sealed (in the store) or a PKCS#11 token's RFC 7512 URI, pkcs11:token=LABEL (the pkcs11 build; docs/hsm.md)")
	cmd.Flags().StringVar(&pkcs11Module, "pkcs11-module", "", "with --custody pkcs11:…, the token's PKCS#11 library, e.g. /usr/lib/softhsm/libsofthsm2.so")
	cmd.Flags().StringVar(&pkcs11PIN, "pkcs11-pin-file", "", "with --custody pkcs11:…, the file holding the token's user PIN, mode 0600 (default: env MUSTER_PKCS11_PIN)")
	out.register(cmd)
	return cmd
}

func printInit(env *Env, out output, res datadir.InitResult) error {
	if err := printInitSummary(env, out, res); err != nil || out.json() {
		return err
	}
	fmt.Fprintf(env.Stdout, `
Deploy agents with:
  MUSTER_AUTHORITY=<the authority's advertised HOST:PORT>
  MUSTER_AUTHORITY_ID=%s
  MUSTER_CA_FINGERPRINT=%s
  MUSTER_BOOTSTRAP_PSK=<the bootstrap PSK, from a secret store>
`, res.Info.AuthorityID, res.Info.CAFingerprint)
	// An authority whose keys are in a token runs as the pkcs11 build: the
	// static muster refuses to open it (docs/hsm.md).
	bin := "muster"
	if res.Info.Custody != nil {
		bin = "muster-pkcs11"
	}
	fmt.Fprintf(env.Stdout, "\nNext: %s authority --data %s%s\n", bin, shellword.Quote(string(res.Dir)), storeHint(res.StoreURL))
	return nil
}

// printInitSummary prints what init made, without how to deploy agents and
// the next step: muster dev, which runs the authority itself, must not tell
// the user to start it, and prints the agents' variables once it knows the
// address (devAgentEnv).
func printInitSummary(env *Env, out output, res datadir.InitResult) error {
	if out.json() {
		return out.write(env.Stdout, map[string]any{
			"authority_id":      res.Info.AuthorityID,
			"trust_domain":      res.Info.TrustDomain,
			"ca_fingerprint":    res.Info.CAFingerprint,
			"bootstrap_psk":     res.BootstrapPSK.Reveal(),
			"bootstrap_psk_id":  res.PSKID,
			"operator":          res.OperatorID.String(),
			"operator_identity": res.OperatorFile,
			"agent_env": map[string]string{
				"MUSTER_AUTHORITY_ID":   res.Info.AuthorityID,
				"MUSTER_CA_FINGERPRINT": res.Info.CAFingerprint,
				"MUSTER_BOOTSTRAP_PSK":  res.BootstrapPSK.Reveal(),
			},
		})
	}
	w := env.Stdout
	fmt.Fprintf(w, "Authority ID:    %s\n", res.Info.AuthorityID)
	fmt.Fprintf(w, "Trust domain:    %s\n", res.Info.TrustDomain)
	fmt.Fprintf(w, "CA fingerprint:  %s\n", res.Info.CAFingerprint)
	fmt.Fprintf(w, "Bootstrap PSK:   %s\n", res.BootstrapPSK.Reveal())
	fmt.Fprintf(w, "Operator:        %s (identity in %s)\n", res.OperatorID, res.OperatorFile)
	fmt.Fprintf(w, `
Keep the bootstrap PSK secret: with it and the CA fingerprint a machine can
join. The authority keeps it only encrypted.
`)
	return nil
}

// storeHint says which store the authority started as "Next:" says opens,
// and where its password comes from: the URL authority.json records has
// none.
func storeHint(url string) string {
	if url == "" {
		return ""
	}
	if strings.HasPrefix(url, "sqlite://") {
		return "\n  (it opens the store authority.json records, " + url + "; --store URL names another)"
	}
	return "\n  (it opens the store authority.json records, " + url + ", with the password from PGPASSWORD or PGPASSFILE; --store URL names another)"
}

// storeAbsolute is init's --store with a relative SQLite path made
// absolute where init runs, where the operator meant it: authority.json
// records it, and the authority (run in / under systemd) and the offline
// commands (run wherever the operator stands) must open the file init
// made, not one under their own working directory. (A relative path in a
// settings file's store: is under the data directory instead, storeUnder:
// that file is read by commands running anywhere.)
func storeAbsolute(url string) (string, error) {
	p, ok := strings.CutPrefix(url, "sqlite://")
	if !ok || p == "" || filepath.IsAbs(p) {
		return url, nil
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("--store %s: cannot make its path absolute: %w (give it absolute: --store sqlite:///PATH)", url, err)
	}
	return "sqlite://" + abs, nil
}

// storeURLWithoutPassword is a store URL as authority.json records it and
// init, messages, check-config and the hints print it: the user name kept
// and every password removed (of the
// user information, and the password and sslpassword parameters), so the
// commands that read the data directory can connect with it and the
// password PGPASSWORD or PGPASSFILE gives, as the authority's driver reads
// it when the URL has none. A URL that does not parse keeps only its
// scheme, as authority.json's URLs without a user name were recorded: the
// commands then ask for --store. So does one whose query does not parse.
func storeURLWithoutPassword(raw string) string {
	if strings.HasPrefix(raw, "sqlite://") {
		// A file path, not a URL the store parses (openStore): it has no
		// password, and url.URL.String would escape a space or a '%' in
		// it into another file's name.
		return raw
	}
	u, err := url.Parse(raw)
	var q url.Values
	if err == nil {
		// u.Query drops the pairs it cannot read, a password among them,
		// and the URL would keep it: such a query is not recorded either.
		q, err = url.ParseQuery(u.RawQuery)
	}
	if err != nil {
		scheme, _, _ := strings.Cut(raw, "://")
		return scheme + "://…@"
	}
	if u.User != nil {
		u.User = url.User(u.User.Username())
	}
	if q.Has("password") || q.Has("sslpassword") {
		q.Del("password")
		q.Del("sslpassword")
		u.RawQuery = q.Encode()
	}
	return u.String()
}
