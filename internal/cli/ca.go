package cli

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// newCACmd is muster ca: the CA hierarchy (docs/ca-lifecycle.md).
func newCACmd(env *Env) *cobra.Command {
	cmd := &cobra.Command{Use: "ca", Short: "The CA hierarchy: roots, intermediates and the trust bundle agents hold"}
	cmd.AddCommand(newCAStatusCmd(env), newCARotateCmd(env), newCARootCmd(env), newCAMigrateCustodyCmd(env))
	return cmd
}

type caCertJSON struct {
	Kind          string    `json:"kind"`
	Role          string    `json:"role,omitempty"`
	State         string    `json:"state"`
	Serial        string    `json:"serial"`
	Subject       string    `json:"subject"`
	NotBefore     time.Time `json:"not_before"`
	NotAfter      time.Time `json:"not_after"`
	Fingerprint   string    `json:"fingerprint"`
	AgentsHolding int64     `json:"agents_holding"`
	// AgentsAwayHolding: agents away (AwayAgents) whose last heartbeat
	// reported holding it.
	AgentsAwayHolding int64 `json:"agents_away_holding"`
	// KeyCustody is where the private key lives: "sealed", the pkcs11:
	// URI of the token object, "file" or "offline" (a root); empty for a
	// cross-certificate.
	KeyCustody string `json:"key_custody,omitempty"`
}

type caStatusJSON struct {
	RootKey         string `json:"root_key"`
	BundleDigest    string `json:"bundle_digest"`
	ConnectedAgents int64  `json:"connected_agents"`
	// AwayAgents: seen before, not connected now, certificate still valid.
	AwayAgents   int64        `json:"away_agents"`
	Certificates []caCertJSON `json:"certificates"`
	Warnings     []string     `json:"warnings"`
}

func caStatusOf(r *musterv1.GetCAStatusResponse) caStatusJSON {
	j := caStatusJSON{RootKey: "offline", BundleDigest: r.GetBundleDigest(), ConnectedAgents: r.GetConnectedAgents(), AwayAgents: r.GetAwayAgents(),
		Certificates: []caCertJSON{}, Warnings: append([]string{}, r.GetWarnings()...)}
	if r.GetRootKeyOnline() {
		j.RootKey = "online"
	}
	for _, c := range r.GetCertificates() {
		j.Certificates = append(j.Certificates, caCertJSON{Kind: c.GetKind(), Role: c.GetRole(), State: c.GetState(),
			Serial: c.GetSerial(), Subject: c.GetSubject(), NotBefore: c.GetNotBefore().AsTime().UTC(),
			NotAfter: c.GetNotAfter().AsTime().UTC(), Fingerprint: c.GetFingerprint(), AgentsHolding: c.GetAgentsHolding(), AgentsAwayHolding: c.GetAgentsAwayHolding(),
			KeyCustody: c.GetKeyCustody()})
	}
	return j
}

func newCAStatusCmd(env *Env) *cobra.Command {
	var (
		af  adminFlags
		out output
	)
	cmd := &cobra.Command{
		Use: "status",
		Example: `  muster ca status
  muster ca status -o json`,
		Short: "Every CA certificate with its state and how many connected agents hold it",
		Long: `Lists the root(s), every intermediate by role with its state (prepared,
active, retiring, retired), serial and not-after, and how many connected
agents reported holding a trust bundle that includes it. Says whether the
root key is online (intermediates rotate by themselves) or offline, and
warns of an intermediate whose half-life is within 60 days while the root
key is offline. See docs/ca-lifecycle.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			resp, err := callAdmin(cmd, env, &af, "ca status", func(ctx context.Context, c *adminClient) (*musterv1.GetCAStatusResponse, error) {
				return c.GetCAStatus(ctx, &musterv1.GetCAStatusRequest{})
			})
			if err != nil {
				return err
			}
			s := caStatusOf(resp)
			if out.json() {
				return out.write(env.Stdout, s)
			}
			for _, w := range s.Warnings {
				fmt.Fprintln(env.Stderr, "warning:", w)
			}
			return printCAStatus(env.Stdout, s)
		},
	}
	af.register(cmd)
	out.register(cmd)
	return cmd
}

// printCAStatus is ca status's table.
func printCAStatus(w io.Writer, s caStatusJSON) error {
	fmt.Fprintf(w, "Root key: %s\nTrust bundle: %s\nConnected agents: %d\nAgents away (seen before, certificate still valid): %d\n\n", s.RootKey, s.BundleDigest, s.ConnectedAgents, s.AwayAgents)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tROLE\tSTATE\tSERIAL\tNOT AFTER\tAGENTS HOLDING\tAWAY HOLDING\tKEY CUSTODY")
	for _, c := range s.Certificates {
		role := c.Role
		if role == "" {
			role = "-"
		}
		where := c.KeyCustody
		if where == "" {
			where = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", c.Kind, role, c.State, c.Serial, c.NotAfter.Format(time.RFC3339), c.AgentsHolding, c.AgentsAwayHolding, where)
	}
	return tw.Flush()
}
