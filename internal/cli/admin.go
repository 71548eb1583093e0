package cli

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/shellword"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

func newAdminCmd(env *Env) *cobra.Command {
	cmd := &cobra.Command{Use: "admin", Short: "Manage operator identities"}
	cmd.AddCommand(newAdminAddCmd(env), newAdminListCmd(env), newAdminRenewCmd(env))
	return cmd
}

func newAdminAddCmd(env *Env) *cobra.Command {
	var (
		af   adminFlags
		ttl  time.Duration
		path string
		out  output
		// reissue renews a name that holds a valid identity.
		reissue bool
		// offline is the break-glass path (adminoffline.go).
		offline              bool
		storeURL, configFile string
	)
	cmd := &cobra.Command{
		Use: "add NAME",
		Example: `  muster admin add alice --data ./muster-data --out alice.pem
  muster admin add ci-bot --ttl 720h --out ci-bot.pem -o json
  muster admin add alice --offline --data /var/lib/muster --out alice.pem
  muster admin add alice --offline --data /var/lib/muster --config /etc/muster/authority.yaml --out alice.pem   # the packaged unit's settings file`,
		Short: "Issue another operator identity",
		Long: `add issues an operator identity (spiffe://TD/admin/NAME) from the admin
intermediate. The key is made here and never leaves this machine; the file
(0600) holds the certificate chain, the key and the root CA.

With --offline (break-glass, when no operator identity works any more) it
does not call the authority: on the machine that holds the authority's data
directory (its storage key and admin intermediate) it signs the identity
itself, records it in the store and appends operator.add to the audit
chain. The store is --store's, else store: in the settings file the
authority is started with (--config FILE, read as muster authority
--config FILE reads it; default DIR/authority.yaml), else the one
DIR/authority.json records: that URL holds no password, which the
PostgreSQL driver reads from PGPASSWORD or PGPASSFILE as the authority's
does; --store is needed only where it cannot connect.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.check(); err != nil {
				return err
			}
			name := args[0]
			if path == "" {
				path = name + ".pem"
			}
			// Before the authority issues anything: a certificate
			// issued and recorded whose file cannot be written leaves
			// the name holding a valid identity whose key is gone.
			if _, err := os.Stat(path); err == nil {
				return fmt.Errorf("admin add: %s already exists; give another --out", path)
			}
			if offline {
				return addOperatorOfflineCmd(cmd, env, &af, storeURL, configFile, name, ttl, path, out)
			}
			for _, f := range []string{"store", "config"} {
				if cmd.Flags().Changed(f) {
					return fmt.Errorf("admin add: --%s goes with --offline", f)
				}
			}
			key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			if err != nil {
				return err
			}
			csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: name}}, key)
			if err != nil {
				return err
			}
			resp, err := callAdmin(cmd, env, &af, "admin add", func(ctx context.Context, c *adminClient) (*musterv1.AddOperatorResponse, error) {
				return c.AddOperator(ctx, &musterv1.AddOperatorRequest{Name: name, Csr: csr, Ttl: durationpb.New(ttl), Reissue: reissue})
			})
			if err != nil {
				return err
			}
			id, err := operatorIdentity("admin add", resp, key)
			if err != nil {
				return err
			}
			if err := id.Save(path, false); err != nil {
				return fmt.Errorf("admin add: %w", err)
			}
			if out.json() {
				return out.write(env.Stdout, operatorJSON(resp, path))
			}
			fmt.Fprintf(env.Stdout, "Operator %s (serial %s) valid until %s\n%s",
				resp.GetSpiffeId(), resp.GetSerial(), resp.GetNotAfter().AsTime().UTC().Format(time.RFC3339), useIdentity(path))
			return nil
		},
	}
	af.register(cmd)
	cmd.Flags().DurationVar(&ttl, "ttl", 720*time.Hour, "lifetime of the identity")
	cmd.Flags().StringVar(&path, "out", "", "file to write the identity to (default NAME.pem); never overwritten")
	cmd.Flags().BoolVar(&reissue, "reissue", false, "issue a new identity to a NAME whose identity is still valid (renewal)")
	cmd.Flags().BoolVar(&offline, "offline", false, "break-glass: sign the identity here with the admin intermediate of --data, without the authority")
	cmd.Flags().StringVar(&storeURL, "store", "", "with --offline: the authority's store URL (env MUSTER_STORE; default: "+storeDefaultHelp+")")
	cmd.Flags().StringVar(&configFile, "config", "", configHelp("with --offline: "))
	out.register(cmd)
	return cmd
}

func newAdminListCmd(env *Env) *cobra.Command {
	var (
		af  adminFlags
		out output
	)
	cmd := &cobra.Command{
		Use: "list",
		Example: `  muster admin list --data ./muster-data
  muster admin list -o yaml`,
		Short: "List the operator certificates the authority issued",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			resp, err := callAdmin(cmd, env, &af, "admin list", func(ctx context.Context, c *adminClient) (*musterv1.ListOperatorsResponse, error) {
				return c.ListOperators(ctx, &musterv1.ListOperatorsRequest{})
			})
			if err != nil {
				return err
			}
			if out.json() {
				type op struct {
					Name      string    `json:"name"`
					SPIFFEID  string    `json:"spiffe_id"`
					Serial    string    `json:"serial"`
					NotAfter  time.Time `json:"not_after"`
					CreatedBy string    `json:"created_by"`
					Locked    bool      `json:"locked"`
				}
				ops := []op{}
				for _, o := range resp.GetOperators() {
					ops = append(ops, op{o.GetName(), o.GetSpiffeId(), o.GetSerial(), o.GetNotAfter().AsTime(), o.GetCreatedBy(), o.GetLocked()})
				}
				return out.write(env.Stdout, ops)
			}
			tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSERIAL\tEXPIRES\tLOCKED\tCREATED BY")
			for _, o := range resp.GetOperators() {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s\n", o.GetName(), o.GetSerial(),
					o.GetNotAfter().AsTime().UTC().Format(time.RFC3339), o.GetLocked(), o.GetCreatedBy())
			}
			return tw.Flush()
		},
	}
	af.register(cmd)
	out.register(cmd)
	return cmd
}

// addOperatorOfflineCmd is admin add --offline: addOperatorOffline, then
// the identity written and reported as admin add reports one.
func addOperatorOfflineCmd(cmd *cobra.Command, env *Env, af *adminFlags, storeURL, configFile, name string, ttl time.Duration, path string, out output) error {
	od, err := loadOfflineDir(env, af.data, configFile)
	if err != nil {
		return fmt.Errorf("admin add: %w", err)
	}
	// The identity names the revocation list the authority's own would.
	crlURL := firstOf(env.Getenv("MUSTER_CRL_URL"), od.cfg.CRLURL)
	op, err := addOperatorOffline(cmd.Context(), od, od.storeURL(env, storeURL), crlURL, name, ttl, time.Now())
	if err != nil {
		return fmt.Errorf("admin add: %w", err)
	}
	if err := op.Identity.Save(path, false); err != nil {
		return fmt.Errorf("admin add: %w", err)
	}
	leaf := op.Identity.Leaf()
	serial := leaf.SerialNumber.Text(16)
	if out.json() {
		return out.write(env.Stdout, map[string]any{
			"spiffe_id": op.ID.String(), "serial": serial,
			"not_after": leaf.NotAfter, "identity": path, "offline": true,
		})
	}
	fmt.Fprintf(env.Stdout, "Operator %s (serial %s) valid until %s, signed offline and audited\n%s",
		op.ID, serial, leaf.NotAfter.UTC().Format(time.RFC3339), useIdentity(path))
	return nil
}

// useIdentity says where a new identity was written and how to use it, in
// lines that paste: admin commands given no --identity and no
// MUSTER_IDENTITY use the data directory's operator.pem, which after a
// break-glass is the expired one, so "written to alice.pem" alone leaves
// the operator refused again.
func useIdentity(path string) string {
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	q := shellword.Quote(path)
	return fmt.Sprintf("Identity written to %s. Use it in this shell with\n  export MUSTER_IDENTITY=%s\nor give --identity %s to each command; without either, admin commands use the data directory's operator.pem.\n", path, q, q)
}

// operatorIdentity is the identity an AddOperator or RenewOperator answer
// certifies for key; verb names the command in its errors.
func operatorIdentity(verb string, resp *musterv1.AddOperatorResponse, key crypto.Signer) (*identity.Identity, error) {
	chain, err := ca.ParseCertsPEM([]byte(resp.GetCertificateChainPem()))
	if err != nil {
		return nil, fmt.Errorf("%s: the authority answered with a bad chain: %w", verb, err)
	}
	roots, err := ca.ParseCertsPEM([]byte(resp.GetCaCertificatePem()))
	if err != nil {
		return nil, fmt.Errorf("%s: the authority answered with a bad root: %w", verb, err)
	}
	return &identity.Identity{Chain: chain, Key: key, Roots: roots}, nil
}

// operatorJSON is what admin add and admin renew print with -o json.
func operatorJSON(resp *musterv1.AddOperatorResponse, path string) map[string]any {
	return map[string]any{
		"spiffe_id": resp.GetSpiffeId(), "serial": resp.GetSerial(),
		"not_after": resp.GetNotAfter().AsTime(), "identity": path,
	}
}
