package storetest

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/muster-dev/muster/internal/store"
)

// errBuild is the error failingAudits' first build returns.
var errBuild = errors.New("boom")

// failingAudits are the audit records a write that carries its own
// record must refuse, and then write nothing: one whose build fails, one
// off the chain, one without a hash, and none at all.
func failingAudits(action string) map[string]func(store.AuditHead) (store.AuditRecord, error) {
	return map[string]func(store.AuditHead) (store.AuditRecord, error){
		"build fails": func(store.AuditHead) (store.AuditRecord, error) { return store.AuditRecord{}, errBuild },
		"record off the chain": func(h store.AuditHead) (store.AuditRecord, error) {
			r, err := link(record(action))(h)
			r.PrevHash = []byte("not the head")
			return r, err
		},
		"record without a hash": func(h store.AuditHead) (store.AuditRecord, error) {
			r, err := link(record(action))(h)
			r.Hash = nil
			return r, err
		},
		"no record at all": nil,
	}
}

// wantUnaudited checks that write, run with each of failingAudits, fails
// (with the build's own error when the build fails) and leaves state and
// the chain's head as they were.
func wantUnaudited(t *testing.T, ctx context.Context, s store.Store, action string, write func(audit func(store.AuditHead) (store.AuditRecord, error)) error, state func() any) {
	t.Helper()
	before, seq := state(), auditSeq(t, ctx, s)
	for name, audit := range failingAudits(action) {
		err := write(audit)
		if err == nil {
			t.Fatalf("%s: %s succeeded", name, action)
		}
		if name == "build fails" && !errors.Is(err, errBuild) {
			t.Errorf("%s: %s = %v; want the build's error", name, action, err)
		}
		wantEqual(t, name+": state after the unaudited "+action, state(), before)
		if got := auditSeq(t, ctx, s); got != seq {
			t.Fatalf("%s: audit chain holds %d records after the unaudited %s; want %d", name, got, action, seq)
		}
	}
}

// raceAppends runs write n times while as many plain appends race it on
// s, and checks every write that succeeded left exactly one record and
// the chain links whole. It returns how many writes succeeded.
func raceAppends(t *testing.T, ctx context.Context, s store.Store, n int, write func(i int) error) int {
	t.Helper()
	seq := auditSeq(t, ctx, s)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		won  int
		errs []error
	)
	for i := range n {
		wg.Go(func() {
			err := write(i)
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				won++
			}
		})
		wg.Go(func() {
			if _, err := s.AppendAudit(ctx, link(record("audit.append"))); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	mustNil(t, "AppendAudit beside the writes", errors.Join(errs...))
	if got := auditSeq(t, ctx, s); got != seq+int64(n+won) {
		t.Fatalf("audit chain holds %d records; want %d (%d before, %d appends, %d writes that succeeded)", got, seq+int64(n+won), seq, n, won)
	}
	recs, err := s.ListAudit(ctx, store.AuditFilter{})
	mustNil(t, "ListAudit", err)
	var prev []byte
	for i, r := range recs {
		if r.Seq != int64(i+1) || string(r.PrevHash) != string(prev) || string(r.Hash) != string(linkHash(prev, r.Seq)) {
			t.Fatalf("record %d: seq %d, broken link", i+1, r.Seq)
		}
		prev = r.Hash
	}
	return won
}

// expireLink builds the psk.expire record of RevokeExpiredGracePSKs.
func expireLink([]string) func(store.AuditHead) (store.AuditRecord, error) {
	return link(record("psk.expire"))
}

// wantAppended checks that the chain holds one record more than seq, the
// last one of action: a write that carries its record left it.
func wantAppended(t *testing.T, ctx context.Context, s store.Store, seq int64, action string) {
	t.Helper()
	recs, err := s.ListAudit(ctx, store.AuditFilter{AfterSeq: seq})
	mustNil(t, "ListAudit", err)
	if len(recs) != 1 || recs[0].Action != action {
		var got []string
		for _, r := range recs {
			got = append(got, r.Action)
		}
		t.Fatalf("records after seq %d: %v; want one %s", seq, got, action)
	}
}

// epochLink builds action's record for a resync window's write.
func epochLink(action string) func(store.ResyncEpoch) func(store.AuditHead) (store.AuditRecord, error) {
	return func(e store.ResyncEpoch) func(store.AuditHead) (store.AuditRecord, error) {
		r := record(action)
		r.Target = "epoch " + e.ID
		return link(r)
	}
}

// sendLink builds the task.send record of QueueTaskToAll.
func sendLink(int) func(store.AuditHead) (store.AuditRecord, error) {
	return link(record("task.send"))
}

// stepLink, advanceLink and dropLink build the records of the signer
// writes.
var (
	stepLink    = link(record("node_task_signer.stage"))
	advanceLink = link(record("node_task_signer.advance"))
	dropLink    = link(record("node_task_signer.destroy_key"))
)

// cleanupLink builds the token.cleanup record of DeleteExpiredTokens.
func cleanupLink([]string) func(store.AuditHead) (store.AuditRecord, error) {
	return link(record("token.cleanup"))
}

// registerLink builds the authority.register record of PutRegistration.
func registerLink(store.Registration) func(store.AuditHead) (store.AuditRecord, error) {
	return link(record("authority.register"))
}
