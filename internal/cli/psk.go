package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

func newPSKCmd(env *Env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "psk",
		Short: "Show and rotate the bootstrap pre-shared key",
		Long: `The bootstrap PSK is the authority-wide secret an agent presents to join
(muster agent join --psk-file FILE, with the CA fingerprint). muster init
creates it. After a
rotation the previous PSK stays accepted for a grace period (24h by
default) while the agents are given the new one.`,
	}
	cmd.AddCommand(newPSKShowCmd(env), newPSKRotateCmd(env))
	return cmd
}

// pskJSON is one PSK as -o json prints it, value included.
type pskJSON struct {
	ID             string     `json:"id"`
	PSK            string     `json:"psk,omitempty"`
	CreatedAt      time.Time  `json:"created_at"`
	GraceExpiresAt *time.Time `json:"grace_expires_at,omitempty"`
}

// pskOf converts p; nil stays nil.
func pskOf(p *musterv1.BootstrapPSK) *pskJSON {
	if p == nil {
		return nil
	}
	j := &pskJSON{ID: p.GetId(), PSK: p.GetPsk(), CreatedAt: p.GetCreatedAt().AsTime()}
	if p.GetGraceExpiresAt() != nil {
		e := p.GetGraceExpiresAt().AsTime()
		j.GraceExpiresAt = &e
	}
	return j
}

func pskTime(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func newPSKShowCmd(env *Env) *cobra.Command {
	var (
		af  adminFlags
		out output
		raw bool
	)
	cmd := &cobra.Command{
		Use: "show",
		Example: `  muster psk show --data ./muster-data
  muster psk show -o json
  muster psk show --raw`,
		Short: "Print the active bootstrap PSK and any PSK in grace",
		Long: `Print the active bootstrap PSK with its creation time, and the previous
PSK while it is in grace, with the end of its grace. --raw prints the
active PSK alone on one line, as --psk-file reads it. Reading the PSK is
audited (psk.show).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			if raw && cmd.Flags().Changed("output") {
				return fmt.Errorf("psk show: --raw prints the bare PSK: give it without -o")
			}
			resp, err := callAdmin(cmd, env, &af, "psk show", func(ctx context.Context, c *adminClient) (*musterv1.GetPSKsResponse, error) {
				return c.GetPSKs(ctx, &musterv1.GetPSKsRequest{})
			})
			if err != nil {
				return err
			}
			active, grace := pskOf(resp.GetActive()), pskOf(resp.GetGrace())
			if raw {
				if active == nil || active.PSK == "" {
					return fmt.Errorf("psk show: the authority has no active PSK")
				}
				fmt.Fprintln(env.Stdout, active.PSK)
				return nil
			}
			if out.json() {
				return out.write(env.Stdout, struct {
					Active *pskJSON `json:"active"`
					Grace  *pskJSON `json:"grace"`
				}{active, grace})
			}
			printPSKs(env.Stdout, active, grace)
			return nil
		},
	}
	af.register(cmd)
	out.register(cmd)
	cmd.Flags().BoolVar(&raw, "raw", false, "print only the active PSK, one line (what --psk-file reads)")
	return cmd
}

func printPSKs(w io.Writer, active, grace *pskJSON) {
	if active != nil {
		fmt.Fprintf(w, "Active PSK:  %s\n  ID:        %s\n  Created:   %s\n", active.PSK, active.ID, pskTime(active.CreatedAt))
	}
	if grace == nil {
		fmt.Fprintln(w, "No PSK in grace.")
		return
	}
	fmt.Fprintf(w, "Grace PSK:   %s\n  ID:        %s\n  Created:   %s\n  Until:     %s\n",
		grace.PSK, grace.ID, pskTime(grace.CreatedAt), pskTime(*grace.GraceExpiresAt))
}

func newPSKRotateCmd(env *Env) *cobra.Command {
	var (
		af          adminFlags
		out         output
		grace       time.Duration
		revokeGrace bool
		fromID      string
	)
	cmd := &cobra.Command{
		Use: "rotate",
		Example: `  muster psk rotate --data ./muster-data --grace 24h
  muster psk rotate --grace 0 --revoke-grace`,
		Short: "Make a new bootstrap PSK and put the current one in grace",
		Long: `Make a new active bootstrap PSK. The current one stays accepted for
--grace (default 24h, at most 720h). --grace 0 revokes the current PSK at
once: agents that have not been given the new one cannot join until they
are.

At most one PSK is in grace. While the previous rotation's PSK is still in
grace, a rotation is refused, since machines not yet given the active PSK
may still join with it: wait until its grace ends (muster psk show prints
when), or give --revoke-grace to revoke it with this rotation; the output
then names it.

The rotation replaces the active PSK it read just before (or --from ID):
if another rotation replaced it meanwhile, nothing changes and the command
fails (ABORTED), so two rotations at once cannot both succeed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			resp, err := callAdmin(cmd, env, &af, "psk rotate", func(ctx context.Context, c *adminClient) (*musterv1.RotatePSKResponse, error) {
				req := &musterv1.RotatePSKRequest{Grace: durationpb.New(grace), RevokeGrace: revokeGrace, FromId: fromID}
				if req.FromId == "" {
					// Rotate from the key read now, not from whatever is
					// active when the write lands: a second rotation a
					// moment after another is refused, not stacked on it.
					cur, err := c.GetPSKs(ctx, &musterv1.GetPSKsRequest{IdsOnly: true})
					if err != nil {
						return nil, err
					}
					req.FromId = cur.GetActive().GetId()
				}
				return c.RotatePSK(ctx, req)
			})
			if err != nil {
				return err
			}
			active, prev, revoked := pskOf(resp.GetActive()), pskOf(resp.GetPrevious()), pskOf(resp.GetRevokedGrace())
			if out.json() {
				return out.write(env.Stdout, struct {
					Active       *pskJSON `json:"active"`
					Previous     *pskJSON `json:"previous"`
					RevokedGrace *pskJSON `json:"revoked_grace,omitempty"`
				}{active, prev, revoked})
			}
			fmt.Fprintf(env.Stdout, "New PSK:      %s\n  ID:         %s\n", active.PSK, active.ID)
			if revoked != nil {
				until := ""
				if revoked.GraceExpiresAt != nil {
					until = " (it was in grace until " + pskTime(*revoked.GraceExpiresAt) + ")"
				}
				fmt.Fprintf(env.Stdout, "Grace PSK:    %s, revoked now%s: machines still given it cannot join until they get the new PSK\n", revoked.ID, until)
			}
			if prev.GraceExpiresAt == nil {
				fmt.Fprintf(env.Stdout, "Previous PSK: %s, revoked now\n", prev.ID)
				fmt.Fprintln(env.Stdout, "\nAgents that have not joined yet need the new PSK in their configuration before they can join.")
				return nil
			}
			fmt.Fprintf(env.Stdout, "Previous PSK: %s, accepted until %s\n", prev.ID, pskTime(*prev.GraceExpiresAt))
			fmt.Fprintf(env.Stdout, "\nUpdate the agents' bootstrap PSK to the new one before %s: after that the previous PSK is refused.\n",
				pskTime(*prev.GraceExpiresAt))
			return nil
		},
	}
	cmd.Flags().DurationVar(&grace, "grace", 24*time.Hour, "how long the current PSK stays accepted; 0 = revoke it now")
	cmd.Flags().BoolVar(&revokeGrace, "revoke-grace", false, "also revoke the PSK still in grace from the rotation before (refused without it)")
	cmd.Flags().StringVar(&fromID, "from", "", "rotate only if this PSK ID (muster psk show) is still the active one; default: the one active just before")
	af.register(cmd)
	out.register(cmd)
	return cmd
}
