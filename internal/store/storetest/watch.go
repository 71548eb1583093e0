package storetest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// Watcher is a store that announces committed changes to open agent
// streams (the authority's changeWatcher).
type Watcher interface {
	WatchChanges(ctx context.Context, notify func(store.Change)) error
}

// notice is how a test writes a change it heard: kind, a colon, then the
// sorted node IDs, comma separated, or * for every node.
func notice(c store.Change) string {
	nodes := "*"
	if c.Nodes != nil {
		ns := slices.Clone(c.Nodes)
		slices.Sort(ns)
		nodes = strings.Join(ns, ",")
	}
	return fmt.Sprintf("%d:%s", c.Kind, nodes)
}

// RunWatchTests checks that a change committed through one store handle is
// announced to a watcher on another handle of the same database, with the
// node IDs it concerns. newPair returns two fresh handles on one fresh,
// empty, migrated database, closed with t.Cleanup; the first must be a
// Watcher.
func RunWatchTests(t *testing.T, newPair func(t *testing.T) (watched, writer store.Store)) {
	t.Helper()
	cases := []struct {
		name string
		// change makes a change through w; want is what the watcher hears.
		change func(t *testing.T, ctx context.Context, w store.Store)
		want   string
	}{
		{"lock: every node", func(t *testing.T, ctx context.Context, w store.Store) {
			mustNil(t, "InsertLock", w.InsertLock(ctx, store.Lock{ID: "l1", Kind: store.LockToken, Target: "t1", Reason: "r",
				CreatedBy: "ops", CreatedAt: at(0)}, link(record("lock.create"))))
		}, notice(store.Change{Kind: store.ChangeStanding})},
		{"node deleted", func(t *testing.T, ctx context.Context, w store.Store) {
			mustNil(t, "DeleteNode", w.DeleteNode(ctx, "n1", link(record("agent.delete"))))
		}, notice(store.Change{Kind: store.ChangeStanding, Nodes: []string{"n1"}})},
		{"node superseded by a join", func(t *testing.T, ctx context.Context, w store.Store) {
			insertTokens(t, ctx, w, token("t-i2", 1, time.Time{}, time.Hour))
			j := newJoin("t-i2", "n1", "i2", "key-i2", storeNow(t, ctx, w))
			j.MaySupersede = true
			mustJoin(t, ctx, w, j)
		}, notice(store.Change{Kind: store.ChangeStanding, Nodes: []string{"n1"}})},
		{"task queued", func(t *testing.T, ctx context.Context, w store.Store) {
			now := storeNow(t, ctx, w)
			tk := taskRow("task1", 0, 0)
			tk.CreatedAt, tk.ExpiresAt = now, now.Add(time.Hour)
			mustNil(t, "InsertTask", w.InsertTask(ctx, tk, []string{"n1", "n2"}, link(record("task.send"))))
		}, notice(store.Change{Kind: store.ChangeTasks, Nodes: []string{"n1", "n2"}})},
		{"signer step: every node", func(t *testing.T, ctx context.Context, w store.Store) {
			_, err := w.ApplySignerChanges(ctx, idAt(t, ctx, w, 0), []store.SignerChange{insert(signerRow("v1", store.SignerActive, 0))}, stepLink)
			mustNil(t, "ApplySignerChanges", err)
		}, notice(store.Change{Kind: store.ChangeSigners})},
		{"CA certificate step: every node", func(t *testing.T, ctx context.Context, w store.Store) {
			mustNil(t, "InsertCACert", w.InsertCACert(ctx, caRow("agent", "a1", store.CAPrepared), link(record("ca.prepare"))))
		}, notice(store.Change{Kind: store.ChangeCA})},
		{"a new stream of the node, so its older stream on any replica ends", func(t *testing.T, ctx context.Context, w store.Store) {
			now := storeNow(t, ctx, w)
			mustNil(t, "RecordAgentStream", w.RecordAgentStream(ctx, store.AgentStream{NodeID: "n1", StreamID: "s1", Replica: "b:1",
				Connected: true, ConnectedAt: now, LastSeen: now}))
		}, notice(store.Change{Kind: store.ChangeStream, Nodes: []string{"n1"}})},
		{"shared setting written: every replica", func(t *testing.T, ctx context.Context, w store.Store) {
			_, err := w.PutSetting(ctx, store.Setting{Key: "signer.min_lead_time", Value: "1m0s", UpdatedBy: "admin:ops"}, store.Setting{}, link(record("setting.set")))
			mustNil(t, "PutSetting", err)
		}, notice(store.Change{Kind: store.ChangeSettings})},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := t.Context()
			watched, writer := newPair(t)
			// Every case starts with node n1 joined, before the watch.
			admit(t, ctx, writer, "n1", "i1", storeNow(t, ctx, writer))
			heard := make(chan string, 16)
			wctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				done <- watched.(Watcher).WatchChanges(wctx, func(c store.Change) { heard <- notice(c) })
			}()
			// The first notice, once listening, is of everything.
			if got, want := next(t, heard), notice(store.Change{Kind: store.ChangeAll}); got != want {
				t.Fatalf("first notice = %q, want %q", got, want)
			}
			c.change(t, ctx, writer)
			if got := next(t, heard); got != c.want {
				t.Fatalf("notice = %q, want %q", got, c.want)
			}
			cancel()
			select {
			case err := <-done:
				mustNil(t, "WatchChanges after cancel", err)
			case <-time.After(10 * time.Second):
				t.Fatal("WatchChanges did not return after its context ended")
			}
			select {
			case got := <-heard:
				t.Fatalf("an extra notice %q", got)
			default:
			}
		})
	}
}

// next waits for one notice.
func next(t *testing.T, heard <-chan string) string {
	t.Helper()
	select {
	case got := <-heard:
		return got
	case <-time.After(10 * time.Second):
		t.Fatal("no notice within 10s")
		return ""
	}
}
