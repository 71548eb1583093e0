package cli

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

func newBoundKeypairCmd(env *Env) *cobra.Command {
	cmd := &cobra.Command{Use: "bound-keypair", Short: "Authority-wide settings of bound-keypair joining"}
	resync := &cobra.Command{Use: "resync", Short: "Let bound-keypair agents back in after the store was restored from a backup",
		Long: `After a restore, agents that recovered since the backup hold join state
documents ahead of the store and are refused join_state_mismatch. A resync
window accepts such a document once per token and brings the token forward;
a second holder of a document from before the restore locks the token, as a
stale document always does. Open it only after a restore, for as long as
your agents need to come back.`}
	resync.AddCommand(newResyncOpenCmd(env), newResyncCloseCmd(env), newResyncStatusCmd(env))
	cmd.AddCommand(resync)
	return cmd
}

type resyncJSON struct {
	Epoch    string     `json:"epoch"`
	Ordinal  int64      `json:"ordinal"`
	Open     bool       `json:"open"`
	OpenedAt time.Time  `json:"opened_at"`
	Until    time.Time  `json:"until"`
	ClosedAt *time.Time `json:"closed_at,omitempty"`
	OpenedBy string     `json:"opened_by"`
	ClosedBy string     `json:"closed_by,omitempty"`
	Reason   string     `json:"reason"`
}

func resyncOf(w *musterv1.ResyncWindow) resyncJSON {
	j := resyncJSON{Epoch: w.GetEpoch(), Ordinal: w.GetOrdinal(), Open: w.GetOpen(), OpenedAt: w.GetOpenedAt().AsTime(),
		Until: w.GetUntil().AsTime(), OpenedBy: w.GetOpenedBy(), ClosedBy: w.GetClosedBy(), Reason: w.GetReason()}
	if w.GetClosedAt() != nil {
		t := w.GetClosedAt().AsTime()
		j.ClosedAt = &t
	}
	return j
}

func newResyncOpenCmd(env *Env) *cobra.Command {
	var (
		af     adminFlags
		out    output
		d      time.Duration
		reason string
	)
	cmd := &cobra.Command{
		Use: "open --for DURATION --reason TEXT",
		Example: `  muster bound-keypair resync open --for 24h --reason "restored muster.db from the 02:00 backup"
  muster bound-keypair resync open --for 2h --reason "PITR to 11:40" -o json`,
		Short: "Open a resync window (audited, at most 7 days)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			if d <= 0 {
				return fmt.Errorf("resync open: --for is required (for example --for 24h)")
			}
			if reason == "" {
				return fmt.Errorf("resync open: --reason is required: say which backup was restored")
			}
			resp, err := callAdmin(cmd, env, &af, "bound-keypair resync open", func(ctx context.Context, c *adminClient) (*musterv1.ResyncWindowResponse, error) {
				return c.OpenResync(ctx, &musterv1.OpenResyncRequest{Duration: durationpb.New(d), Reason: reason})
			})
			if err != nil {
				return err
			}
			w := resp.GetWindow()
			if out.json() {
				return out.write(env.Stdout, resyncOf(w))
			}
			fmt.Fprintf(env.Stdout, "Resync window open until %s (epoch %s).\n", w.GetUntil().AsTime().UTC().Format(time.RFC3339), w.GetEpoch())
			fmt.Fprintln(env.Stdout, "Each bound-keypair token accepts one join state ahead of the store until then; `muster audit list --action token.resync` shows them.")
			return nil
		},
	}
	cmd.Flags().DurationVar(&d, "for", 0, "how long the window stays open (at most 168h)")
	cmd.Flags().StringVar(&reason, "reason", "", "why (required, audited): which backup was restored")
	af.register(cmd)
	out.register(cmd)
	return cmd
}

func newResyncCloseCmd(env *Env) *cobra.Command {
	var (
		af     adminFlags
		out    output
		reason string
	)
	cmd := &cobra.Command{
		Use: "close",
		Example: `  muster bound-keypair resync close
  muster bound-keypair resync close --reason "all agents back" -o yaml`,
		Short: "Close the open resync window before its end",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			resp, err := callAdmin(cmd, env, &af, "bound-keypair resync close", func(ctx context.Context, c *adminClient) (*musterv1.ResyncWindowResponse, error) {
				return c.CloseResync(ctx, &musterv1.CloseResyncRequest{Reason: reason})
			})
			if err != nil {
				return err
			}
			if out.json() {
				return out.write(env.Stdout, resyncOf(resp.GetWindow()))
			}
			fmt.Fprintf(env.Stdout, "Resync window of epoch %s closed.\n", resp.GetWindow().GetEpoch())
			return nil
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit log")
	af.register(cmd)
	out.register(cmd)
	return cmd
}

func newResyncStatusCmd(env *Env) *cobra.Command {
	var (
		af  adminFlags
		out output
	)
	cmd := &cobra.Command{
		Use: "status",
		Example: `  muster bound-keypair resync status
  muster bound-keypair resync status -o json`,
		Short: "List the resync windows, oldest first, and whether one is open",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			resp, err := callAdmin(cmd, env, &af, "bound-keypair resync status", func(ctx context.Context, c *adminClient) (*musterv1.ListResyncResponse, error) {
				return c.ListResync(ctx, &musterv1.ListResyncRequest{})
			})
			if err != nil {
				return err
			}
			if out.json() {
				list := []resyncJSON{}
				for _, w := range resp.GetWindows() {
					list = append(list, resyncOf(w))
				}
				return out.write(env.Stdout, list)
			}
			return printResync(env.Stdout, resp.GetWindows())
		},
	}
	af.register(cmd)
	out.register(cmd)
	return cmd
}

// printResync is resync status's table.
func printResync(w io.Writer, ws []*musterv1.ResyncWindow) error {
	if len(ws) == 0 {
		_, err := fmt.Fprintln(w, "No resync window was ever opened.")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "EPOCH\tSTATE\tOPENED\tUNTIL\tBY\tREASON")
	for _, r := range ws {
		state := "ended"
		switch {
		case r.GetOpen():
			state = "open"
		case r.GetClosedAt() != nil:
			state = "closed by " + r.GetClosedBy()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.GetEpoch(), state, r.GetOpenedAt().AsTime().UTC().Format(time.RFC3339),
			r.GetUntil().AsTime().UTC().Format(time.RFC3339), r.GetOpenedBy(), r.GetReason())
	}
	return tw.Flush()
}
