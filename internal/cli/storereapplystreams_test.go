package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/store"
)

// TestStoreReapplyClosesTheBackupsStreams: the restored store's stream
// rows marked connected (the backup's, of streams that ended with the
// authorities it was taken from) are marked closed by store reapply
// --apply, with a store.reapply record, their last-seen times kept; a
// stream row closed already is left. Before, they stayed marked
// connected, and agents list gave each as connected via its old address
// for up to 2 minutes past its last heartbeat in the backup.
func TestStoreReapplyClosesTheBackupsStreams(t *testing.T) {
	f := newReapplyFixture(t)
	seen := time.Now().Add(-10 * time.Second).Truncate(time.Millisecond)
	rows := []store.AgentStream{
		{NodeID: "web-1", StreamID: "s1", Replica: "10.0.0.1:7443", Connected: true, ConnectedAt: seen.Add(-time.Hour), LastSeen: seen},
		{NodeID: "web-2", StreamID: "s2", Replica: "10.0.0.2:7443", ConnectedAt: seen.Add(-time.Hour), LastSeen: seen.Add(-time.Minute)},
	}
	f.with(t, f.db, func(ctx context.Context, st store.Store, _ *audit.Logger) {
		for _, r := range rows {
			if err := st.RecordAgentStream(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
	})
	f.backUp(t)
	f.restore(t)
	head := f.head(t)

	streams := func() (got []store.AgentStream) {
		f.with(t, f.db, func(ctx context.Context, st store.Store, _ *audit.Logger) {
			for _, r := range rows {
				row, err := st.GetAgentStream(ctx, r.NodeID)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, row)
			}
		})
		return got
	}
	// Without --apply: nothing changes.
	if code, out, errOut := f.run(t); code != 0 {
		t.Fatalf("store reapply: exit %d\n%s%s", code, out, errOut)
	}
	if got := streams(); !got[0].Connected || f.head(t) != head {
		t.Fatalf("store reapply without --apply changed the store: %+v", got)
	}

	code, out, errOut := f.run(t, "--apply")
	if code != 0 {
		t.Fatalf("store reapply --apply: exit %d\n%s%s", code, out, errOut)
	}
	got := streams()
	for i, r := range got {
		if r.Connected || !r.LastSeen.Equal(rows[i].LastSeen) || r.Replica != rows[i].Replica {
			t.Errorf("%s after store reapply --apply: %+v; want it closed, last seen %s as in the backup", r.NodeID, r, rows[i].LastSeen)
		}
	}
	if want := "Marked closed the agent stream the restored store held as connected, from before the backup (record "; !strings.Contains(out, want) {
		t.Errorf("store reapply --apply printed:\n%s\nwant %q", out, want)
	}
	f.with(t, f.db, func(ctx context.Context, st store.Store, _ *audit.Logger) {
		recs, err := st.ListAudit(ctx, store.AuditFilter{AfterSeq: head})
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) != 1 || recs[0].Action != reapplyAction || recs[0].Target != "agent streams" {
			t.Errorf("records after the restored head: %+v; want one store.reapply of the agent streams", recs)
		}
	})

	// Run again: none is marked connected, nothing is written.
	if code, out, errOut := f.run(t, "--apply"); code != 0 || strings.Contains(out, "Marked closed") {
		t.Fatalf("store reapply --apply again: exit %d\n%s%s", code, out, errOut)
	}
	if f.head(t) != head+1 {
		t.Errorf("the second store reapply --apply appended a record")
	}
}
