package cli

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

func newAuditCmd(env *Env) *cobra.Command {
	cmd := &cobra.Command{Use: "audit", Short: "Read and verify the audit log"}
	cmd.AddCommand(newAuditListCmd(env), newAuditVerifyCmd(env))
	return cmd
}

type auditJSON struct {
	Seq           int64     `json:"seq"`
	Time          time.Time `json:"time"`
	Actor         string    `json:"actor"`
	Action        string    `json:"action"`
	Target        string    `json:"target"`
	Result        string    `json:"result"`
	Reason        string    `json:"reason,omitempty"`
	Source        string    `json:"source,omitempty"`
	CorrelationID string    `json:"correlation_id,omitempty"`
	Hash          string    `json:"hash"`
}

func newAuditListCmd(env *Env) *cobra.Command {
	var (
		af     adminFlags
		out    output
		since  string
		action string
		limit  int
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List audit records, oldest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			req := &musterv1.ListAuditRequest{Action: action}
			if since != "" {
				t, err := parseSince(since, time.Now())
				if err != nil {
					return fmt.Errorf("audit list: %w", err)
				}
				req.Since = timestamppb.New(t)
			}
			var recs []*musterv1.AuditRecord
			if err := af.call(cmd, env, "audit list", func(ctx context.Context, c *adminClient) error {
				for {
					req.Limit = int32(min(limit-len(recs), 1000))
					resp, err := c.ListAudit(ctx, req)
					if err != nil {
						return err
					}
					recs = append(recs, resp.GetRecords()...)
					if resp.GetNextAfterSeq() == 0 || len(recs) >= limit {
						return nil
					}
					req.AfterSeq = resp.GetNextAfterSeq()
				}
			}); err != nil {
				return err
			}
			if out.json() {
				list := []auditJSON{}
				for _, r := range recs {
					list = append(list, auditJSON{r.GetSeq(), r.GetTime().AsTime(), r.GetActor(), r.GetAction(), r.GetTarget(),
						r.GetResult(), r.GetReason(), r.GetSource(), r.GetCorrelationId(), r.GetHash()})
				}
				return writeJSON(env.Stdout, list)
			}
			tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SEQ\tTIME\tACTOR\tACTION\tTARGET\tRESULT\tREASON")
			for _, r := range recs {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", r.GetSeq(), r.GetTime().AsTime().UTC().Format(time.RFC3339),
					r.GetActor(), r.GetAction(), r.GetTarget(), r.GetResult(), r.GetReason())
			}
			return tw.Flush()
		},
	}
	af.register(cmd)
	out.register(cmd)
	cmd.Flags().StringVar(&since, "since", "", "only records at or after this time: RFC 3339, or a duration ago such as 2h")
	cmd.Flags().StringVar(&action, "action", "", "only this action, or a prefix ending in * (token.*)")
	cmd.Flags().IntVar(&limit, "limit", 10000, "at most this many records")
	return cmd
}

// parseSince reads an absolute RFC 3339 time or a duration before now.
func parseSince(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("--since %q: give an RFC 3339 time or a duration such as 2h", s)
}

func newAuditVerifyCmd(env *Env) *cobra.Command {
	var (
		af  adminFlags
		out output
	)
	cmd := &cobra.Command{
		Use:   "verify",
		Short: "Check the audit chain and its signed checkpoints; exits non-zero on tampering",
		Long: `verify asks the authority to walk the whole audit chain: every record's
keyed hash, the links between records, and the signed checkpoints kept in
the store and in the data directory. It names the first record that was
edited, removed or inserted, even when the whole chain was rewritten in the
database, and exits non-zero.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			r, err := callAdmin(cmd, env, &af, "audit verify", func(ctx context.Context, c *adminClient) (*musterv1.VerifyAuditResponse, error) {
				return c.VerifyAudit(ctx, &musterv1.VerifyAuditRequest{})
			})
			if err != nil {
				return err
			}
			if out.json() {
				if err := writeJSON(env.Stdout, map[string]any{
					"ok": r.GetOk(), "records_checked": r.GetRecordsChecked(), "checkpoints_checked": r.GetCheckpointsChecked(),
					"first_bad_seq": r.GetFirstBadSeq(), "problem": r.GetProblem(), "head_seq": r.GetHeadSeq(), "head_hash": r.GetHeadHash(),
				}); err != nil {
					return err
				}
			} else if r.GetOk() {
				fmt.Fprintf(env.Stdout, "audit chain intact: %d records, %d signed checkpoints, head %d %s\n",
					r.GetRecordsChecked(), r.GetCheckpointsChecked(), r.GetHeadSeq(), r.GetHeadHash())
			}
			if !r.GetOk() {
				return fmt.Errorf("audit verify: tampering detected at record %d: %s", r.GetFirstBadSeq(), r.GetProblem())
			}
			return nil
		},
	}
	af.register(cmd)
	out.register(cmd)
	return cmd
}
