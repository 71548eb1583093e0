package cli

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

func newAdminRenewCmd(env *Env) *cobra.Command {
	var (
		af   adminFlags
		ttl  time.Duration
		path string
		out  output
	)
	cmd := &cobra.Command{
		Use: "renew",
		Example: `  muster admin renew --data ./muster-data
  muster admin renew --identity alice.pem --ttl 720h`,
		Short: "Renew the operator identity in use: a new key, the same name",
		Long: `renew asks the authority, over the operator identity in use, for a
certificate of the same name on a new key made here, and replaces the
identity file in use (or --out) atomically, mode 0600. The authority audits it
as operator.renew. An identity that has already expired cannot renew:
another operator issues a new one with muster admin add NAME --out FILE, or,
with no operator left, muster admin add NAME --offline --data DIR --out FILE
where the authority's data directory is.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			if err != nil {
				return err
			}
			resp, err := callAdmin(cmd, env, &af, "admin renew", func(ctx context.Context, c *adminClient) (*musterv1.AddOperatorResponse, error) {
				id, err := af.id.ID()
				if err != nil {
					return nil, err
				}
				csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: id.Name}}, key)
				if err != nil {
					return nil, err
				}
				return c.RenewOperator(ctx, &musterv1.RenewOperatorRequest{Csr: csr, Ttl: durationpb.New(ttl)})
			})
			if err != nil {
				return err
			}
			id, err := operatorIdentity("admin renew", resp, key)
			if err != nil {
				return err
			}
			if path == "" {
				path = af.idPath
			}
			// Written to a temporary file and renamed: a crash leaves the
			// old identity or the new one, never neither.
			if err := id.Save(path, true); err != nil {
				return fmt.Errorf("admin renew: the new identity (serial %s) could not be written, the old one still works until it expires: %w", resp.GetSerial(), err)
			}
			if out.json() {
				return out.write(env.Stdout, operatorJSON(resp, path))
			}
			fmt.Fprintf(env.Stdout, "Operator %s renewed (serial %s), valid until %s\nIdentity written to %s\n",
				resp.GetSpiffeId(), resp.GetSerial(), resp.GetNotAfter().AsTime().UTC().Format(time.RFC3339), path)
			return nil
		},
	}
	af.register(cmd)
	cmd.Flags().DurationVar(&ttl, "ttl", 720*time.Hour, "lifetime of the renewed identity")
	cmd.Flags().StringVar(&path, "out", "", "file to write the renewed identity to (default: replace the identity in use)")
	out.register(cmd)
	return cmd
}
