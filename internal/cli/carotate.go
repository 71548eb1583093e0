package cli

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"math/big"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/muster-dev/muster/internal/ca"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

type caIntermediateJSON struct {
	Role        string     `json:"role"`
	Serial      string     `json:"serial"`
	State       string     `json:"state"`
	NotBefore   time.Time  `json:"not_before"`
	NotAfter    time.Time  `json:"not_after"`
	CreatedAt   *time.Time `json:"created_at,omitempty"`
	ActivatedAt *time.Time `json:"activated_at,omitempty"`
	RetiresAt   *time.Time `json:"retires_at,omitempty"`
}

func caIntermediateOf(c *musterv1.CAIntermediate) *caIntermediateJSON {
	if c == nil {
		return nil
	}
	j := &caIntermediateJSON{Role: c.GetRole(), Serial: c.GetSerial(), State: c.GetState(),
		NotBefore: c.GetNotBefore().AsTime().UTC(), NotAfter: c.GetNotAfter().AsTime().UTC()}
	if c.GetCreatedAt() != nil {
		t := c.GetCreatedAt().AsTime().UTC()
		j.CreatedAt = &t
	}
	if c.GetActivatedAt() != nil {
		t := c.GetActivatedAt().AsTime().UTC()
		j.ActivatedAt = &t
	}
	if c.GetRetiresAt() != nil {
		t := c.GetRetiresAt().AsTime().UTC()
		j.RetiresAt = &t
	}
	return j
}

func newCARotateCmd(env *Env) *cobra.Command {
	var (
		af       adminFlags
		out      output
		activate bool
		serial   string
		rootKey  string
		offline  bool
		storeURL string
		// configFile is --config, with --offline.
		configFile string
		// token is --pkcs11-module and --pkcs11-pin-file, with --offline.
		token tokenAccess
	)
	cmd := &cobra.Command{
		Use: "rotate ROLE [--activate] [--root-key FILE] [--offline --data DIR]",
		Example: `  muster ca rotate agent                           # prepare the agent intermediate's successor now
  muster ca rotate agent --root-key /media/usb/root.key   # the same, with the root key offline
  muster ca rotate agent --activate                # make the prepared one sign every new agent certificate
  muster ca rotate agent --activate --serial f83e4b3002aed5a8cc33535f7f325353   # only if that one (the whole serial muster ca status shows) is still the prepared one
  muster ca rotate jwt                             # sign JWT-SVIDs with the next key version now
  muster ca rotate agent --offline --data /var/lib/muster/authority   # its key is lost with the token, or it expired: replace it`,
		Short: "Prepare a CA intermediate's successor ahead of time, or activate the prepared one (audited)",
		Long: `ROLE is bootstrap, server, agent or admin. Without --activate, prepares the
successor of ROLE's intermediate: a new key (made and sealed by the
authority) and a certificate from the root. It joins the trust bundle at
once and signs nothing until it is activated, by the leader at two thirds
of the active intermediate's life or by --activate.

With the root key kept offline, --root-key FILE signs the successor here,
with the root key read from FILE (PKCS#8 PEM, as DIR/ca/root.key): the
authority drafts the certificate and makes the key; only the signed
certificate goes back. The root key never leaves this machine.

--activate refuses while nothing is prepared, and until the prepared one
has been published by every replica (about ten seconds after it was
prepared). To activate only the prepared intermediate you looked at, give
--serial SERIAL (as muster ca status shows it): if the leader activated
that one meanwhile and prepared another, it is refused, naming both.
Without --serial, the command reads muster ca status when it runs and
guards only against a change between that read and its write: a
successor prepared since you read the status is activated.

--offline replaces ROLE's active intermediate whose key is gone from the
PKCS#11 token (lost without a backup; docs/hsm.md "A lost token"), or
whose certificate has expired (the authority was stopped, or its store
restored from a backup, for longer than it had left; docs/ca-lifecycle.md
"An expired intermediate"), on the machine with the data directory,
without the authority (which refuses to start without a server
intermediate that signs): a new intermediate under the root (its key in
the token, or sealed without one), active at once; the old one stays in
the trust bundle until it retires. It needs the root key: in the data
directory, in custody, or --root-key FILE. Refused while the active key
opens and its certificate has not expired. Audited. It opens the store the authority uses: --store, else
store: in the settings file the authority is started with (--config FILE,
read as muster authority --config FILE reads it; default
DIR/authority.yaml), else the one DIR/authority.json records.

ROLE jwt rotates the JWT-SVID signing key instead (docs/workload-api.md):
the next version signs from now on; the JWKS keeps the previous one until
its tokens have expired. It is refused within jwt_svid's minimum period
of the last rotation.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.check(); err != nil {
				return err
			}
			role := args[0]
			if offline {
				if activate {
					return errors.New("ca rotate: --offline activates the new intermediate at once; drop --activate")
				}
				if af.authority != "" || af.identity != "" {
					return errors.New("ca rotate: --offline talks to no authority: drop --authority and --identity")
				}
				return rotateLostOffline(cmd, env, af.data, storeURL, configFile, role, rootKey, token, out)
			}
			if token.module != "" || token.pinFile != "" {
				return errors.New("ca rotate: --pkcs11-module and --pkcs11-pin-file go with --offline (the authority opens its own token)")
			}
			if storeURL != "" {
				return errors.New("ca rotate: --store goes with --offline")
			}
			if configFile != "" {
				return errors.New("ca rotate: --config goes with --offline")
			}
			if role == "jwt" {
				if activate || rootKey != "" {
					return errors.New("ca rotate jwt: takes neither --activate nor --root-key: the next JWT-SVID key is derived and published already, and signs at once")
				}
				return rotateJWTKey(cmd, env, &af, out)
			}
			if serial != "" && !activate {
				return errors.New("ca rotate: --serial names the prepared intermediate --activate activates: add --activate, or drop --serial to prepare one")
			}
			if activate && rootKey != "" {
				return errors.New("ca rotate: --activate needs no root key; prepare with --root-key first, then activate")
			}
			var resp *musterv1.CAIntermediateResponse
			var err error
			switch {
			case activate:
				resp, err = callAdmin(cmd, env, &af, "ca rotate", func(ctx context.Context, c *adminClient) (*musterv1.CAIntermediateResponse, error) {
					req := &musterv1.ActivateCAIntermediateRequest{Role: role, Serial: serial}
					if req.Serial == "" {
						// What the operator means is the one prepared now:
						// named, so that one the leader activated and
						// replaced by a new one meanwhile is not activated
						// in its place before its time.
						st, err := c.GetCAStatus(ctx, &musterv1.GetCAStatusRequest{})
						if err != nil {
							return nil, err
						}
						req.Serial = preparedSerial(st.GetCertificates(), role)
					}
					return c.ActivateCAIntermediate(ctx, req)
				})
			case rootKey != "":
				key, kerr := readRootKey(rootKey)
				if kerr != nil {
					return fmt.Errorf("ca rotate: %w", kerr)
				}
				resp, err = callAdmin(cmd, env, &af, "ca rotate", func(ctx context.Context, c *adminClient) (*musterv1.CAIntermediateResponse, error) {
					d, err := c.DraftCAIntermediate(ctx, &musterv1.DraftCAIntermediateRequest{Role: role})
					if err != nil {
						return nil, err
					}
					cert, err := signDraft(d, key)
					if err != nil {
						return nil, err
					}
					return c.PrepareCAIntermediate(ctx, &musterv1.PrepareCAIntermediateRequest{Role: role, Serial: d.GetSerial(),
						KeyRef: d.GetKeyRef(), CertificateDer: cert.Raw})
				})
			default:
				resp, err = callAdmin(cmd, env, &af, "ca rotate", func(ctx context.Context, c *adminClient) (*musterv1.CAIntermediateResponse, error) {
					return c.PrepareCAIntermediate(ctx, &musterv1.PrepareCAIntermediateRequest{Role: role})
				})
			}
			if err != nil {
				return err
			}
			in := resp.GetIntermediate()
			if out.json() {
				return out.write(env.Stdout, map[string]any{"intermediate": caIntermediateOf(in), "previous": caIntermediateOf(resp.GetPrevious())})
			}
			if activate {
				fmt.Fprintf(env.Stdout, "Activated the %s intermediate %s (valid until %s): it signs every new %s certificate from now on.\n",
					in.GetRole(), in.GetSerial(), in.GetNotAfter().AsTime().UTC().Format(time.RFC3339), in.GetRole())
				if p := resp.GetPrevious(); p != nil {
					// An older authority does not say when: the not-after is
					// the latest it can be.
					until, by := p.GetRetiresAt(), "once the last certificate it signed has expired"
					if until == nil {
						until, by = p.GetNotAfter(), "at the latest"
					}
					fmt.Fprintf(env.Stdout, "The previous one, %s, is retiring: it stays in the trust bundle until %s (%s).\n", p.GetSerial(), until.AsTime().UTC().Format(time.RFC3339), by)
				}
				return nil
			}
			fmt.Fprintf(env.Stdout, "Prepared the %s intermediate %s (valid until %s): it is in the trust bundle and signs nothing yet.\n",
				in.GetRole(), in.GetSerial(), in.GetNotAfter().AsTime().UTC().Format(time.RFC3339))
			fmt.Fprintf(env.Stdout, "The leader activates it at two thirds of the active one's life; to activate it now: muster ca rotate %s --activate\n", in.GetRole())
			return nil
		},
	}
	cmd.Flags().BoolVar(&activate, "activate", false, "activate ROLE's prepared intermediate instead of preparing one")
	cmd.Flags().StringVar(&serial, "serial", "", "with --activate: activate only if the prepared intermediate is still SERIAL (muster ca status shows it); default: the one read when the command runs, which guards only against a change between that read and the activation, not since you read the status")
	cmd.Flags().StringVar(&rootKey, "root-key", "", "sign the successor here with the root key in FILE (the root key is kept offline)")
	cmd.Flags().BoolVar(&offline, "offline", false, "replace ROLE's active intermediate whose key is lost from the token, or that has expired, here, with the data directory (--data) and without the authority")
	cmd.Flags().StringVar(&storeURL, "store", "", "with --offline: the authority's store URL (env MUSTER_STORE; default: "+storeDefaultHelp+")")
	cmd.Flags().StringVar(&configFile, "config", "", configHelp("with --offline: "))
	cmd.Flags().StringVar(&token.module, "pkcs11-module", "", "with --offline: the PKCS#11 library of the authority's token, as the authority's --pkcs11-module (env MUSTER_PKCS11_MODULE; default: the one DIR/authority.json records)")
	cmd.Flags().StringVar(&token.pinFile, "pkcs11-pin-file", "", "with --offline: the file holding the token's user PIN, mode 0600, as the authority's --pkcs11-pin-file (env MUSTER_PKCS11_PIN_FILE; default: the one DIR/authority.json records, else env MUSTER_PKCS11_PIN)")
	af.register(cmd)
	out.register(cmd)
	return cmd
}

// readRootKey reads a PKCS#8 PEM root key; a file others can read is
// refused, as the authority refuses its own key files.
func readRootKey(path string) (*rootKeyFile, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%s is readable by others (mode %o); chmod 600 it", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	k, err := ca.ParseKeyPEM(b)
	if err != nil {
		return nil, fmt.Errorf("%s: not a root key (PKCS#8 PEM, as DIR/ca/root.key): %w", path, err)
	}
	return &rootKeyFile{path: path, key: k}, nil
}

type rootKeyFile struct {
	path string
	key  crypto.Signer
}

// signDraft signs the authority's draft with the root key, after checking
// that the root it names is the key's.
func signDraft(d *musterv1.DraftCAIntermediateResponse, k *rootKeyFile) (*x509.Certificate, error) {
	root, err := x509.ParseCertificate(d.GetRootDer())
	if err != nil {
		return nil, fmt.Errorf("the authority's root certificate: %w", err)
	}
	pub, err := x509.ParsePKIXPublicKey(d.GetPublicKeyDer())
	if err != nil {
		return nil, fmt.Errorf("the drafted intermediate's public key: %w", err)
	}
	serial, ok := new(big.Int).SetString(d.GetSerial(), 16)
	if !ok {
		return nil, fmt.Errorf("the drafted serial %q is not hex", d.GetSerial())
	}
	if eq, ok := k.key.Public().(interface{ Equal(crypto.PublicKey) bool }); !ok || !eq.Equal(root.PublicKey) {
		return nil, fmt.Errorf("%s is not this authority's root key (its root is %s)", k.path, ca.Fingerprint(root))
	}
	return ca.SignDraft(ca.Draft{Role: ca.Role(d.GetRole()), Serial: serial, Public: pub, RawSubject: d.GetRawSubject(),
		NotBefore: d.GetNotBefore().AsTime(), NotAfter: d.GetNotAfter().AsTime()}, root, k.key)
}

// preparedSerial is role's prepared intermediate in a status listing ("" if
// none: the authority then refuses with its own reason).
func preparedSerial(cs []*musterv1.CACertificateStatus, role string) string {
	for _, c := range cs {
		if c.GetKind() == "intermediate" && c.GetRole() == role && c.GetState() == "prepared" {
			return c.GetSerial()
		}
	}
	return ""
}
