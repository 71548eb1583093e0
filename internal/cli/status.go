package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

func newStatusCmd(env *Env) *cobra.Command {
	var (
		af  adminFlags
		out output
	)
	cmd := &cobra.Command{
		Use: "status",
		Example: `  muster status --data ./muster-data
  muster status -o json`,
		Short: "Show which authority answers and who you are to it",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			r, err := callAdmin(cmd, env, &af, "status", func(ctx context.Context, c *adminClient) (*musterv1.GetStatusResponse, error) {
				return c.GetStatus(ctx, &musterv1.GetStatusRequest{})
			})
			if err != nil {
				return err
			}
			notAfter := af.id.Leaf().NotAfter
			if out.json() {
				return out.write(env.Stdout, map[string]any{
					"authority_id": r.GetAuthorityId(), "trust_domain": r.GetTrustDomain(),
					"ca_fingerprint": r.GetCaFingerprint(), "version": r.GetVersion(), "caller": r.GetCaller(),
					"schema_version": r.GetSchemaVersion(), "started_at": r.GetStartedAt().AsTime(),
					"identity": af.idPath, "identity_not_after": notAfter,
					"ca_warnings": append([]string{}, r.GetCaWarnings()...),
				})
			}
			fmt.Fprintf(env.Stdout, "Authority:       %s (muster %s, schema %d, up since %s)\nCA fingerprint:  %s\nYou are:         %s\nIdentity:        %s, valid until %s\n",
				r.GetAuthorityId(), r.GetVersion(), r.GetSchemaVersion(), r.GetStartedAt().AsTime().UTC().Format(time.RFC3339),
				r.GetCaFingerprint(), r.GetCaller(), af.idPath, notAfter.UTC().Format(time.RFC3339))
			if w := expiryWarning(af.idPath, af.id, af.id.Leaf().Subject.CommonName, firstOf(af.data, env.Getenv("MUSTER_DATA")), af.callArgs(), false, time.Now()); w != "" {
				fmt.Fprintf(env.Stdout, "Warning:         %s\n", strings.TrimPrefix(w, "warning: "))
			}
			for _, w := range r.GetCaWarnings() {
				fmt.Fprintf(env.Stdout, "Warning:         %s\n", w)
			}
			return nil
		},
	}
	af.register(cmd)
	out.register(cmd)
	return cmd
}
