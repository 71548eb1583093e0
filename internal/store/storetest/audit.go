package storetest

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// linkHash stands in for package audit's hash: sha256(prev || seq).
func linkHash(prev []byte, seq int64) []byte {
	h := sha256.New()
	h.Write(prev)
	binary.Write(h, binary.BigEndian, seq)
	return h.Sum(nil)
}

// link returns the build function that appends r as the next correct link
// of the chain; r's Seq, PrevHash and Hash are filled in, and a zero Time
// becomes base plus Seq minutes. The build fills a copy of r: one link
// may be shared by tests run in parallel (stepLink), each building on its
// own store's head.
func link(tmpl store.AuditRecord) func(store.AuditHead) (store.AuditRecord, error) {
	return func(head store.AuditHead) (store.AuditRecord, error) {
		r := tmpl
		r.Seq = head.Seq + 1
		r.PrevHash = head.Hash
		r.Hash = linkHash(head.Hash, r.Seq)
		if r.Time.IsZero() {
			r.Time = at(time.Duration(r.Seq) * time.Minute)
		}
		return r, nil
	}
}

func record(action string) store.AuditRecord {
	return store.AuditRecord{
		Actor:         "spiffe://muster.test/operator/alice",
		Action:        action,
		Target:        "node-1",
		Result:        "ok",
		Reason:        "because",
		Source:        "192.0.2.1:4242",
		CorrelationID: "corr-" + action,
	}
}

// appendN appends n correct links and returns them as AppendAudit did.
func appendN(t *testing.T, ctx context.Context, s store.Store, n int) []store.AuditRecord {
	t.Helper()
	var recs []store.AuditRecord
	for i := range n {
		r, err := s.AppendAudit(ctx, link(record(fmt.Sprintf("test.%d", i))))
		mustNil(t, "AppendAudit", err)
		recs = append(recs, r)
	}
	return recs
}

// wantChain checks that the store holds exactly want and its head matches.
func wantChain(t *testing.T, ctx context.Context, s store.Store, want []store.AuditRecord) {
	t.Helper()
	got, err := s.ListAudit(ctx, store.AuditFilter{})
	mustNil(t, "ListAudit", err)
	wantEqual(t, "ListAudit", got, want)
	head, err := s.AuditHead(ctx)
	mustNil(t, "AuditHead", err)
	var wantHead store.AuditHead
	if len(want) > 0 {
		wantHead = store.AuditHead{Seq: want[len(want)-1].Seq, Hash: want[len(want)-1].Hash}
	}
	wantEqual(t, "AuditHead", head, wantHead)
}

func auditCases() []testCase {
	cases := []testCase{
		{"empty chain", func(t *testing.T, ctx context.Context, s store.Store) {
			head, err := s.AuditHead(ctx)
			mustNil(t, "AuditHead", err)
			if head.Seq != 0 || head.Hash != nil {
				t.Errorf("AuditHead = %+v, want Seq 0 and a nil Hash", head)
			}
			wantChain(t, ctx, s, nil)
		}},
		{"append links from seq 1", func(t *testing.T, ctx context.Context, s store.Store) {
			var (
				heads []store.AuditHead
				recs  []store.AuditRecord
			)
			for i := range 3 {
				build := link(record(fmt.Sprintf("test.%d", i)))
				r, err := s.AppendAudit(ctx, func(h store.AuditHead) (store.AuditRecord, error) {
					heads = append(heads, h)
					return build(h)
				})
				mustNil(t, "AppendAudit", err)
				recs = append(recs, r)
			}
			h1, h2 := linkHash(nil, 1), linkHash(linkHash(nil, 1), 2)
			wantEqual(t, "heads passed to build", heads, []store.AuditHead{{}, {Seq: 1, Hash: h1}, {Seq: 2, Hash: h2}})
			if heads[0].Hash != nil {
				t.Errorf("first head Hash = %x, want nil", heads[0].Hash)
			}
			for i, r := range recs {
				if r.Seq != int64(i+1) {
					t.Errorf("record %d: Seq = %d, want %d", i, r.Seq, i+1)
				}
			}
			r0 := record("test.0")
			r0.Seq, r0.Time, r0.Hash = 1, at(time.Minute), h1
			wantEqual(t, "first record", recs[0], r0)
			wantChain(t, ctx, s, recs)
		}},
		{"build error is returned and nothing written", func(t *testing.T, ctx context.Context, s store.Store) {
			recs := appendN(t, ctx, s, 2)
			errBuild := errors.New("build failed")
			_, err := s.AppendAudit(ctx, func(store.AuditHead) (store.AuditRecord, error) {
				return store.AuditRecord{}, errBuild
			})
			wantErr(t, "AppendAudit", err, errBuild)
			wantChain(t, ctx, s, recs)
			// The chain still extends normally.
			r, err := s.AppendAudit(ctx, link(record("after")))
			mustNil(t, "AppendAudit after failure", err)
			if r.Seq != 3 {
				t.Errorf("Seq after failed append = %d, want 3", r.Seq)
			}
		}},
		{"concurrent appends form one chain", concurrentAppends},
		{"list default limit is 1000", func(t *testing.T, ctx context.Context, s store.Store) {
			appendN(t, ctx, s, 1005)
			got, err := s.ListAudit(ctx, store.AuditFilter{})
			mustNil(t, "ListAudit", err)
			if len(got) != 1000 || got[0].Seq != 1 || got[999].Seq != 1000 {
				t.Fatalf("ListAudit returned %d records, want seq 1..1000", len(got))
			}
			rest, err := s.ListAudit(ctx, store.AuditFilter{AfterSeq: 1000})
			mustNil(t, "ListAudit AfterSeq", err)
			if len(rest) != 5 || rest[0].Seq != 1001 {
				t.Fatalf("ListAudit after 1000 returned %d records, want seq 1001..1005", len(rest))
			}
		}},
	}

	// Each bad link is offered after `existing` good ones and must fail
	// with ErrConflict, leaving the chain as it was.
	bad := []struct {
		name     string
		existing int
		mutate   func(*store.AuditRecord)
	}{
		{"seq 0 on empty chain conflicts", 0, func(r *store.AuditRecord) { r.Seq = 0 }},
		{"seq 2 on empty chain conflicts", 0, func(r *store.AuditRecord) { r.Seq = 2 }},
		{"prev hash on empty chain conflicts", 0, func(r *store.AuditRecord) { r.PrevHash = linkHash(nil, 0) }},
		{"skipped seq conflicts", 2, func(r *store.AuditRecord) { r.Seq++ }},
		{"repeated seq conflicts", 2, func(r *store.AuditRecord) { r.Seq-- }},
		{"wrong prev hash conflicts", 2, func(r *store.AuditRecord) { r.PrevHash = linkHash(nil, 1) }},
		{"missing prev hash conflicts", 2, func(r *store.AuditRecord) { r.PrevHash = nil }},
		{"truncated prev hash conflicts", 2, func(r *store.AuditRecord) { r.PrevHash = r.PrevHash[:31] }},
	}
	for _, b := range bad {
		cases = append(cases, testCase{b.name, func(t *testing.T, ctx context.Context, s store.Store) {
			recs := appendN(t, ctx, s, b.existing)
			build := link(record("bad"))
			_, err := s.AppendAudit(ctx, func(h store.AuditHead) (store.AuditRecord, error) {
				r, err := build(h)
				b.mutate(&r)
				return r, err
			})
			wantErr(t, "AppendAudit", err, store.ErrConflict)
			wantChain(t, ctx, s, recs)
		}})
	}
	return cases
}

// concurrentAppends has 50 goroutines append 10 records each: the chain
// must come out as seq 1..500 with no gap, each PrevHash the previous Hash.
func concurrentAppends(t *testing.T, ctx context.Context, s store.Store) {
	const workers, each = 50, 10
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				r := record(fmt.Sprintf("worker.%d", w))
				r.Time = at(time.Duration(w*each+i) * time.Second)
				if _, err := s.AppendAudit(ctx, link(r)); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("concurrent AppendAudit: %v", err)
	}

	var all []store.AuditRecord
	for after := int64(0); ; {
		page, err := s.ListAudit(ctx, store.AuditFilter{AfterSeq: after, Limit: 128})
		mustNil(t, "ListAudit", err)
		if len(page) == 0 {
			break
		}
		all = append(all, page...)
		after = page[len(page)-1].Seq
	}
	if len(all) != workers*each {
		t.Fatalf("chain has %d records, want %d", len(all), workers*each)
	}
	var prev []byte
	for i, r := range all {
		if r.Seq != int64(i+1) {
			t.Fatalf("record %d has Seq %d, want %d", i, r.Seq, i+1)
		}
		wantEqual(t, fmt.Sprintf("record %d PrevHash", r.Seq), r.PrevHash, prev)
		wantEqual(t, fmt.Sprintf("record %d Hash", r.Seq), r.Hash, linkHash(prev, r.Seq))
		prev = r.Hash
	}
	head, err := s.AuditHead(ctx)
	mustNil(t, "AuditHead", err)
	wantEqual(t, "AuditHead", head, store.AuditHead{Seq: workers * each, Hash: prev})
}

func auditListCases() []testCase {
	// The fixture: seq i+1 has action actions[i] and time base+i minutes.
	actions := []string{
		"token.issue",     // 1
		"token.revoke",    // 2
		"node.join",       // 3
		"token.issue",     // 4
		"tokenx.issue",    // 5
		"Token.issue",     // 6
		"token",           // 7
		"node.join.retry", // 8
		"psk.rotate",      // 9
	}
	minute := func(i int) time.Time { return at(time.Duration(i) * time.Minute) }
	filters := []struct {
		name string
		f    store.AuditFilter
		want []int64
	}{
		{"no filter", store.AuditFilter{}, []int64{1, 2, 3, 4, 5, 6, 7, 8, 9}},
		{"since is inclusive", store.AuditFilter{Since: minute(3)}, []int64{4, 5, 6, 7, 8, 9}},
		{"since between records", store.AuditFilter{Since: minute(3).Add(time.Microsecond)}, []int64{5, 6, 7, 8, 9}},
		{"since after all", store.AuditFilter{Since: minute(9)}, nil},
		{"exact action", store.AuditFilter{Action: "token.issue"}, []int64{1, 4}},
		{"exact action is not a prefix", store.AuditFilter{Action: "node.join"}, []int64{3}},
		{"exact action is case-sensitive", store.AuditFilter{Action: "token.Issue"}, nil},
		{"prefix action", store.AuditFilter{Action: "token.*"}, []int64{1, 2, 4}},
		{"bare prefix", store.AuditFilter{Action: "token*"}, []int64{1, 2, 4, 5, 7}},
		{"prefix is case-sensitive", store.AuditFilter{Action: "Token.*"}, []int64{6}},
		{"star matches all", store.AuditFilter{Action: "*"}, []int64{1, 2, 3, 4, 5, 6, 7, 8, 9}},
		{"prefix matching nothing", store.AuditFilter{Action: "zzz.*"}, nil},
		{"unknown action", store.AuditFilter{Action: "nothing"}, nil},
		{"after seq", store.AuditFilter{AfterSeq: 4}, []int64{5, 6, 7, 8, 9}},
		{"after last seq", store.AuditFilter{AfterSeq: 9}, nil},
		{"limit", store.AuditFilter{Limit: 3}, []int64{1, 2, 3}},
		{"page", store.AuditFilter{AfterSeq: 2, Limit: 2}, []int64{3, 4}},
		{"prefix after seq", store.AuditFilter{Action: "token.*", AfterSeq: 2}, []int64{4}},
		{"all filters", store.AuditFilter{Since: minute(1), Action: "token*", AfterSeq: 2, Limit: 2}, []int64{4, 5}},
	}
	var cases []testCase
	for _, fc := range filters {
		cases = append(cases, testCase{fc.name, func(t *testing.T, ctx context.Context, s store.Store) {
			var recs []store.AuditRecord
			for i, a := range actions {
				r := record(a)
				r.Time = minute(i)
				got, err := s.AppendAudit(ctx, link(r))
				mustNil(t, "AppendAudit", err)
				recs = append(recs, got)
			}
			var want []store.AuditRecord
			for _, seq := range fc.want {
				want = append(want, recs[seq-1])
			}
			got, err := s.ListAudit(ctx, fc.f)
			mustNil(t, "ListAudit", err)
			wantEqual(t, fmt.Sprintf("ListAudit(%+v)", fc.f), got, want)
		}})
	}
	return cases
}
