package cli

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/store"
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
		af  adminFlags
		out output
		lf  auditListFlags
		of  auditOfflineFlags
	)
	cmd := &cobra.Command{
		Use: "list",
		Example: `  muster audit list --data ./muster-data --limit 20
  muster audit list --action token.create --since 24h -o json
  muster audit list --offline --data ./muster-data --action authority.start
  muster audit list --offline --data /var/lib/muster/authority --config /etc/muster/authority.yaml   # the packaged unit's settings file`,
		Short: "List audit records, oldest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			if err := of.check(cmd, "audit list"); err != nil {
				return err
			}
			f, err := lf.filter(time.Now())
			if err != nil {
				return fmt.Errorf("audit list: %w", err)
			}
			if of.offline {
				st, _, err := of.open(cmd.Context(), env, &af)
				if err != nil {
					return fmt.Errorf("audit list: %w", err)
				}
				defer st.Close()
				recs, err := listStoredAudit(cmd.Context(), st, &lf, f)
				if err != nil {
					return fmt.Errorf("audit list: %w", err)
				}
				return writeAuditList(env.Stdout, out, recs)
			}
			req := &musterv1.ListAuditRequest{Action: f.Action}
			if !f.Since.IsZero() {
				req.Since = timestamppb.New(f.Since)
			}
			var recs []auditJSON
			if err := af.call(cmd, env, "audit list", func(ctx context.Context, c *adminClient) error {
				recs, err = lf.page(func(afterSeq int64, n int) ([]auditJSON, int64, error) {
					req.AfterSeq, req.Limit = afterSeq, int32(n)
					resp, err := c.ListAudit(ctx, req)
					if err != nil {
						return nil, 0, err
					}
					var page []auditJSON
					for _, r := range resp.GetRecords() {
						page = append(page, auditJSON{r.GetSeq(), r.GetTime().AsTime(), r.GetActor(), r.GetAction(), r.GetTarget(),
							r.GetResult(), r.GetReason(), r.GetSource(), r.GetCorrelationId(), r.GetHash()})
					}
					return page, resp.GetNextAfterSeq(), nil
				})
				return err
			}); err != nil {
				return err
			}
			return writeAuditList(env.Stdout, out, recs)
		},
	}
	af.register(cmd)
	out.register(cmd)
	lf.register(cmd)
	of.register(cmd)
	return cmd
}

// auditListFlags are the filters of audit list and discovery audit list.
type auditListFlags struct {
	since  string
	action string
	limit  int
}

func (lf *auditListFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&lf.since, "since", "", "only records at or after this time: RFC 3339, or a duration ago such as 2h")
	cmd.Flags().StringVar(&lf.action, "action", "", "only this action, or a prefix ending in * (token.*)")
	cmd.Flags().IntVar(&lf.limit, "limit", 10000, "at most this many records")
}

// filter is the store filter the flags ask for; the caller pages.
func (lf *auditListFlags) filter(now time.Time) (store.AuditFilter, error) {
	f := store.AuditFilter{Action: lf.action}
	if lf.since != "" {
		t, err := parseSince(lf.since, now)
		if err != nil {
			return store.AuditFilter{}, err
		}
		f.Since = t
	}
	return f, nil
}

// maxAuditPage is how many records audit list asks for at a time.
const maxAuditPage = 1000

// page collects up to --limit records from fetch, which returns at most n
// records after afterSeq and the seq to continue after, 0 at the end.
func (lf *auditListFlags) page(fetch func(afterSeq int64, n int) ([]auditJSON, int64, error)) ([]auditJSON, error) {
	var (
		recs  []auditJSON
		after int64
	)
	for {
		page, next, err := fetch(after, min(lf.limit-len(recs), maxAuditPage))
		if err != nil {
			return nil, err
		}
		recs = append(recs, page...)
		if next == 0 || len(recs) >= lf.limit {
			return recs, nil
		}
		after = next
	}
}

// auditRecordJSON is a record of a store as audit list prints it.
func auditRecordJSON(r store.AuditRecord) auditJSON {
	return auditJSON{r.Seq, r.Time, r.Actor, r.Action, r.Target, r.Result, r.Reason, r.Source, r.CorrelationID, hex.EncodeToString(r.Hash)}
}

// writeAuditList prints records as a table, or as JSON.
func writeAuditList(w io.Writer, out output, recs []auditJSON) error {
	if out.json() {
		if recs == nil {
			recs = []auditJSON{}
		}
		return out.write(w, recs)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tTIME\tACTOR\tACTION\tTARGET\tRESULT\tREASON")
	for _, r := range recs {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Seq, r.Time.UTC().Format(time.RFC3339),
			r.Actor, r.Action, r.Target, r.Result, r.Reason)
	}
	return tw.Flush()
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
		of  auditOfflineFlags
	)
	cmd := &cobra.Command{
		Use: "verify",
		Example: `  muster audit verify --data ./muster-data
  muster audit verify -o json
  muster audit verify --offline --data ./muster-data
  muster audit verify --offline --data /var/lib/muster/authority --config /etc/muster/authority.yaml   # the packaged unit's settings file`,
		Short: "Check the audit chain and its signed checkpoints; exits non-zero on tampering",
		Long: `verify asks the authority to walk the whole audit chain: every record's
keyed hash, the links between records, and the signed checkpoints kept in
the store and in the data directory. It names the first record that was
edited, removed or inserted, even when the whole chain was rewritten in the
database, and exits non-zero.

With --offline it walks the chain in the store itself, from the data
directory (its storage key derives the chain's key), whether or not the
authority runs: the way to check the chain of an authority that refuses to
start. The store is --store's, else store: in the settings file the
authority is started with (--config FILE, read as muster authority
--config FILE reads it; default DIR/authority.yaml), else the one
DIR/authority.json records. Only the authority's own verify is recorded in
the chain.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			if err := of.check(cmd, "audit verify"); err != nil {
				return err
			}
			if of.offline {
				st, l, err := of.open(cmd.Context(), env, &af)
				if err != nil {
					return fmt.Errorf("audit verify: %w", err)
				}
				defer st.Close()
				rep, err := l.Verify(cmd.Context())
				if err != nil {
					return fmt.Errorf("audit verify: %w", err)
				}
				return writeAuditVerify(env.Stdout, out, "audit verify", auditVerifyOf(rep))
			}
			r, err := callAdmin(cmd, env, &af, "audit verify", func(ctx context.Context, c *adminClient) (*musterv1.VerifyAuditResponse, error) {
				return c.VerifyAudit(ctx, &musterv1.VerifyAuditRequest{})
			})
			if err != nil {
				return err
			}
			return writeAuditVerify(env.Stdout, out, "audit verify", auditVerify{
				OK: r.GetOk(), RecordsChecked: r.GetRecordsChecked(), CheckpointsChecked: r.GetCheckpointsChecked(),
				FirstBadSeq: r.GetFirstBadSeq(), Problem: r.GetProblem(), HeadSeq: r.GetHeadSeq(), HeadHash: r.GetHeadHash(),
			})
		},
	}
	af.register(cmd)
	out.register(cmd)
	of.register(cmd)
	return cmd
}

// auditVerify is the outcome of a verification, of the authority's chain
// (through the admin API) or of discovery's (audit.Report).
type auditVerify struct {
	OK                 bool
	RecordsChecked     int64
	CheckpointsChecked int64
	FirstBadSeq        int64
	Problem            string
	HeadSeq            int64
	HeadHash           string
}

// auditVerifyOf reads a report of audit.Logger.Verify.
func auditVerifyOf(rep audit.Report) auditVerify {
	return auditVerify{OK: rep.OK, RecordsChecked: rep.RecordsChecked, CheckpointsChecked: rep.CheckpointsChecked,
		FirstBadSeq: rep.FirstBadSeq, Problem: rep.Problem, HeadSeq: rep.Head.Seq, HeadHash: hex.EncodeToString(rep.Head.Hash)}
}

// writeAuditVerify prints the outcome of a verification, and returns an
// error naming the first bad record when the chain was tampered with.
func writeAuditVerify(w io.Writer, out output, name string, r auditVerify) error {
	if out.json() {
		if err := out.write(w, map[string]any{
			"ok": r.OK, "records_checked": r.RecordsChecked, "checkpoints_checked": r.CheckpointsChecked,
			"first_bad_seq": r.FirstBadSeq, "problem": r.Problem, "head_seq": r.HeadSeq, "head_hash": r.HeadHash,
		}); err != nil {
			return err
		}
	} else if r.OK {
		fmt.Fprintf(w, "audit chain intact: %d records, %d signed checkpoints, head %d %s\n",
			r.RecordsChecked, r.CheckpointsChecked, r.HeadSeq, r.HeadHash)
	}
	switch {
	case !r.OK && r.FirstBadSeq == 0:
		// No record is named (a file outside the store is wrong, as a
		// damaged audit-head): "at record 0" would name one that is not.
		return fmt.Errorf("%s: the chain does not verify: %s", name, r.Problem)
	case !r.OK:
		return fmt.Errorf("%s: tampering detected at record %d: %s", name, r.FirstBadSeq, r.Problem)
	}
	return nil
}
