package storetest

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/muster-dev/muster/internal/store"
)

func taskRow(id string, created, expires time.Duration) store.Task {
	return store.Task{ID: id, Type: "node.report", SignerVersionID: "v1", Signed: []byte("signed-" + id),
		CreatedBy: "spiffe://td/admin/ops", CreatedAt: at(created), ExpiresAt: at(expires)}
}

func taskIDs(t *testing.T, ctx context.Context, s store.Store, node string) []string {
	t.Helper()
	ts, err := s.PendingTasks(ctx, node)
	mustNil(t, "PendingTasks", err)
	ids := []string{}
	for _, x := range ts {
		ids = append(ids, x.ID)
	}
	return ids
}

func taskCases() []testCase {
	return []testCase{
		{"queued per node, answered once", func(t *testing.T, ctx context.Context, s store.Store) {
			now, err := s.Now(ctx)
			mustNil(t, "Now", err)
			a := taskRow("a", 0, 0)
			a.CreatedAt, a.ExpiresAt = now.Add(-time.Minute).Truncate(time.Microsecond), now.Add(time.Hour).Truncate(time.Microsecond)
			b := a
			b.ID, b.CreatedAt = "b", a.CreatedAt.Add(time.Second)
			mustNil(t, "InsertTask a", s.InsertTask(ctx, a, []string{"n1", "n2"}, link(record("task.send"))))
			mustNil(t, "InsertTask b", s.InsertTask(ctx, b, []string{"n1"}, link(record("task.send"))))
			wantErr(t, "InsertTask duplicate", s.InsertTask(ctx, a, []string{"n3"}, link(record("task.send"))), store.ErrConflict)

			got, err := s.PendingTasks(ctx, "n1")
			mustNil(t, "PendingTasks", err)
			if diff := cmp.Diff([]store.Task{a, b}, got, cmpOpts); diff != "" {
				t.Fatalf("PendingTasks n1 (-want +got):\n%s", diff)
			}
			if ids := taskIDs(t, ctx, s, "n3"); len(ids) != 0 {
				t.Fatalf("the duplicate queued %v for n3", ids)
			}
			mustNil(t, "MarkTaskDelivered", s.MarkTaskDelivered(ctx, "a", "n1"))
			wantErr(t, "MarkTaskDelivered twice", s.MarkTaskDelivered(ctx, "a", "n1"), store.ErrConflict)
			if ids := taskIDs(t, ctx, s, "n1"); !cmp.Equal(ids, []string{"a", "b"}) {
				t.Fatalf("a delivered task is pending until answered: %v", ids)
			}
			mustNil(t, "RecordTaskResult", s.RecordTaskResult(ctx, "a", "n1", store.TaskOK, "done", link(record("task.result"))))
			wantErr(t, "RecordTaskResult twice", s.RecordTaskResult(ctx, "a", "n1", store.TaskRefused, "replayed", link(record("task.result"))), store.ErrConflict)
			wantErr(t, "RecordTaskResult not sent", s.RecordTaskResult(ctx, "b", "n2", store.TaskOK, "", link(record("task.result"))), store.ErrNotFound)
			wantErr(t, "MarkTaskDelivered answered", s.MarkTaskDelivered(ctx, "a", "n1"), store.ErrConflict)
			if ids := taskIDs(t, ctx, s, "n1"); !cmp.Equal(ids, []string{"b"}) {
				t.Fatalf("pending n1 = %v, want b", ids)
			}
			// An undelivered queued task can be answered too (a refusal of
			// a task the agent got through another replica's stream).
			mustNil(t, "RecordTaskResult queued", s.RecordTaskResult(ctx, "a", "n2", store.TaskRefused, "mistargeted", link(record("task.result"))))
		}},
		{"several tasks are queued all or none", func(t *testing.T, ctx context.Context, s store.Store) {
			now, err := s.Now(ctx)
			mustNil(t, "Now", err)
			page := func(id string) store.Task {
				x := taskRow(id, 0, 0)
				x.CreatedAt, x.ExpiresAt = now.Truncate(time.Microsecond), now.Add(time.Hour).Truncate(time.Microsecond)
				return x
			}
			mustNil(t, "InsertTask taken", s.InsertTask(ctx, page("taken"), []string{"n9"}, link(record("task.send"))))
			// The second page's ID is taken: the first page is not kept.
			wantErr(t, "InsertTasks with a taken ID", s.InsertTasks(ctx, []store.QueuedTask{
				{Task: page("p1"), NodeIDs: []string{"n1", "n2"}}, {Task: page("taken"), NodeIDs: []string{"n3"}}}, link(record("task.send"))), store.ErrConflict)
			for _, n := range []string{"n1", "n2", "n3"} {
				if ids := taskIDs(t, ctx, s, n); len(ids) != 0 {
					t.Fatalf("a failed InsertTasks left %v queued for %s", ids, n)
				}
			}
			mustNil(t, "InsertTasks", s.InsertTasks(ctx, []store.QueuedTask{
				{Task: page("p1"), NodeIDs: []string{"n1", "n2"}}, {Task: page("p2"), NodeIDs: []string{"n3"}}}, link(record("task.send"))))
			for n, want := range map[string][]string{"n1": {"p1"}, "n2": {"p1"}, "n3": {"p2"}} {
				if ids := taskIDs(t, ctx, s, n); !cmp.Equal(ids, want) {
					t.Fatalf("pending %s = %v, want %v", n, ids, want)
				}
			}
		}},
		{"an unaudited send or answer changes nothing; an audited one writes its record", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			nodes := []string{"n1", "n2", "n3"}
			for i, n := range nodes {
				mustJoin(t, ctx, s, newJoin("", n, "inst-"+n, "k"+strconv.Itoa(i), now))
			}
			row := func(id string) store.Task {
				x := taskRow(id, 0, 0)
				x.CreatedAt, x.ExpiresAt = now.Truncate(time.Microsecond), now.Add(time.Hour).Truncate(time.Microsecond)
				return x
			}
			pending := func() any {
				out := map[string][]string{}
				for _, n := range nodes {
					out[n] = taskIDs(t, ctx, s, n)
				}
				return out
			}
			wantUnaudited(t, ctx, s, "task.send", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
				return s.InsertTasks(ctx, []store.QueuedTask{{Task: row("p1"), NodeIDs: []string{"n1"}}, {Task: row("p2"), NodeIDs: []string{"n2"}}}, audit)
			}, pending)
			var counted []int
			wantUnaudited(t, ctx, s, "task.send", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
				_, err := s.QueueTaskToAll(ctx, row("all"), 2, func([]string) {}, func(n int) func(store.AuditHead) (store.AuditRecord, error) {
					counted = append(counted, n)
					return audit
				})
				return err
			}, pending)
			// The record is built for the nodes queued, all pages of them.
			if len(counted) == 0 || counted[0] != len(nodes) {
				t.Fatalf("the send's records were built for %v nodes; want %d", counted, len(nodes))
			}
			seq := auditSeq(t, ctx, s)
			mustNil(t, "InsertTasks with its record", s.InsertTasks(ctx, []store.QueuedTask{{Task: row("p1"), NodeIDs: []string{"n1"}}}, link(record("task.send"))))
			wantAppended(t, ctx, s, seq, "task.send")
			seq = auditSeq(t, ctx, s)
			n, err := s.QueueTaskToAll(ctx, row("all"), 2, func([]string) {}, sendLink)
			mustNil(t, "QueueTaskToAll with its record", err)
			wantEqual(t, "nodes queued", n, len(nodes))
			wantAppended(t, ctx, s, seq, "task.send")
			wantEqual(t, "pending after the audited sends", pending(), any(map[string][]string{"n1": {"all", "p1"}, "n2": {"all"}, "n3": {"all"}}))

			wantUnaudited(t, ctx, s, "task.result", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
				return s.RecordTaskResult(ctx, "p1", "n1", store.TaskOK, "done", audit)
			}, pending)
			seq = auditSeq(t, ctx, s)
			mustNil(t, "RecordTaskResult with its record", s.RecordTaskResult(ctx, "p1", "n1", store.TaskOK, "done", link(record("task.result"))))
			wantAppended(t, ctx, s, seq, "task.result")
			// A refused answer (a second one, one never sent) writes no
			// record.
			wantErr(t, "RecordTaskResult twice", s.RecordTaskResult(ctx, "p1", "n1", store.TaskOK, "again", link(record("task.result"))), store.ErrConflict)
			wantErr(t, "RecordTaskResult not sent", s.RecordTaskResult(ctx, "p1", "n2", store.TaskOK, "", link(record("task.result"))), store.ErrNotFound)
			wantAppended(t, ctx, s, seq, "task.result")
			wantEqual(t, "pending after the answer", pending(), any(map[string][]string{"n1": {"all"}, "n2": {"all"}, "n3": {"all"}}))
		}},
		{"a task to all is queued for every node, a page at a time", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			nodes := []string{"n1", "n2", "n3", "n4", "n5", "n6", "n7"}
			for i, n := range nodes {
				mustJoin(t, ctx, s, newJoin("", n, "inst-"+n, "k"+strconv.Itoa(i), now))
			}
			row := func(id string) store.Task {
				x := taskRow(id, 0, 0)
				x.CreatedAt, x.ExpiresAt = now.Truncate(time.Microsecond), now.Add(time.Hour).Truncate(time.Microsecond)
				return x
			}
			for _, size := range []int{1, 3, 7, 100} {
				id := "all-" + strconv.Itoa(size)
				var pages [][]string
				n, err := s.QueueTaskToAll(ctx, row(id), size, func(ids []string) { pages = append(pages, slices.Clone(ids)) }, sendLink)
				mustNil(t, "QueueTaskToAll "+id, err)
				if n != len(nodes) {
					t.Fatalf("page size %d: queued for %d nodes, want %d", size, n, len(nodes))
				}
				if got := slices.Concat(pages...); !cmp.Equal(got, nodes) {
					t.Fatalf("page size %d: pages %v, want %v in order", size, pages, nodes)
				}
				for _, p := range pages {
					if len(p) > size {
						t.Fatalf("page size %d: a page of %d", size, len(p))
					}
				}
			}
			for _, n := range nodes {
				if ids := taskIDs(t, ctx, s, n); !cmp.Equal(ids, []string{"all-1", "all-100", "all-3", "all-7"}) {
					t.Fatalf("pending %s = %v", n, ids)
				}
			}
			// A taken ID queues nothing more.
			_, err := s.QueueTaskToAll(ctx, row("all-3"), 2, func([]string) {}, sendLink)
			wantErr(t, "QueueTaskToAll with a taken ID", err, store.ErrConflict)
		}},
		{"concurrent sends to all of one task ID: exactly one stands", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			for i, n := range []string{"n1", "n2", "n3"} {
				mustJoin(t, ctx, s, newJoin("", n, "inst-"+n, "k"+strconv.Itoa(i), now))
			}
			x := taskRow("x", 0, 0)
			x.CreatedAt, x.ExpiresAt = now.Truncate(time.Microsecond), now.Add(time.Hour).Truncate(time.Microsecond)
			const n = 6
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					_, errs[i] = s.QueueTaskToAll(ctx, x, 2, func([]string) {}, sendLink)
				})
			}
			wg.Wait()
			if ok := successes(t, "send", errs); ok != 1 {
				t.Fatalf("%d sends stood, want 1", ok)
			}
			for _, node := range []string{"n1", "n2", "n3"} {
				if ids := taskIDs(t, ctx, s, node); !cmp.Equal(ids, []string{"x"}) {
					t.Fatalf("pending %s = %v, want [x] once", node, ids)
				}
			}
		}},
		{"expired tasks are not pending", func(t *testing.T, ctx context.Context, s store.Store) {
			now, err := s.Now(ctx)
			mustNil(t, "Now", err)
			old := taskRow("old", 0, 0)
			old.CreatedAt, old.ExpiresAt = now.Add(-time.Hour), now.Add(-time.Second)
			mustNil(t, "InsertTask", s.InsertTask(ctx, old, []string{"n1"}, link(record("task.send"))))
			if ids := taskIDs(t, ctx, s, "n1"); len(ids) != 0 {
				t.Fatalf("expired task pending: %v", ids)
			}
		}},
		{"concurrent answers: exactly one stands", func(t *testing.T, ctx context.Context, s store.Store) {
			now, err := s.Now(ctx)
			mustNil(t, "Now", err)
			x := taskRow("x", 0, 0)
			x.CreatedAt, x.ExpiresAt = now, now.Add(time.Hour)
			mustNil(t, "InsertTask", s.InsertTask(ctx, x, []string{"n1"}, link(record("task.send"))))
			const n = 8
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() { errs[i] = s.RecordTaskResult(ctx, "x", "n1", store.TaskOK, "", link(record("task.result"))) })
			}
			wg.Wait()
			if ok := successes(t, "answer", errs); ok != 1 {
				t.Fatalf("%d answers stood, want 1", ok)
			}
		}},
	}
}
