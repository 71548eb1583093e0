package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// joinAuditCases: a join's or renewal's audit record is written in the
// same transaction as the change, so both are durable or neither is.
func joinAuditCases() []testCase {
	head := func(t *testing.T, ctx context.Context, s store.Store) int64 {
		t.Helper()
		h, err := s.AuditHead(ctx)
		mustNil(t, "AuditHead", err)
		return h.Seq
	}
	return []testCase{
		{"join appends its record", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, token("t1", 1, now.Add(time.Hour), time.Hour))
			j := newJoin("t1", "node-1", "i1", "key-1", now)
			j.Audit = link(record("agent.join"))
			mustJoin(t, ctx, s, j)
			if got := head(t, ctx, s); got != 1 {
				t.Fatalf("audit head after a join = %d, want 1", got)
			}
		}},
		{"refused join appends nothing", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, token("t1", 1, now.Add(time.Hour), time.Hour), token("t2", 1, now.Add(time.Hour), time.Hour))
			mustJoin(t, ctx, s, newJoin("t1", "node-1", "i1", "key-1", now))
			j := newJoin("t2", "node-1", "i2", "key-2", now)
			j.Audit = link(record("agent.join"))
			if _, err := s.CommitJoin(ctx, j); !errors.Is(err, store.ErrNodeTaken) {
				t.Fatalf("CommitJoin = %v, want ErrNodeTaken", err)
			}
			if got := head(t, ctx, s); got != 0 {
				t.Fatalf("audit head after a refused join = %d, want 0", got)
			}
		}},
		{"failing audit build undoes the join", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, token("t1", 1, now.Add(time.Hour), time.Hour))
			j := newJoin("t1", "node-1", "i1", "key-1", now)
			boom := errors.New("boom")
			j.Audit = func(store.AuditHead) (store.AuditRecord, error) { return store.AuditRecord{}, boom }
			if _, err := s.CommitJoin(ctx, j); !errors.Is(err, boom) {
				t.Fatalf("CommitJoin = %v, want the build error", err)
			}
			if _, err := s.GetNode(ctx, "node-1"); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("node written although its audit record failed: %v", err)
			}
			tok, err := s.GetToken(ctx, "t1")
			mustNil(t, "GetToken", err)
			if tok.UsesCount != 0 {
				t.Fatalf("token use kept although the join failed")
			}
		}},
		{"renewal appends its record", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, token("t1", 1, now.Add(time.Hour), time.Hour))
			j := newJoin("t1", "node-1", "i1", "key-1", now)
			mustJoin(t, ctx, s, j)
			r := store.Renewal{InstanceID: "i1", FromGeneration: 0, ChainPEM: []byte("chain-1"), Audit: link(record("agent.renew")),
				Certificate: store.Certificate{Serial: serial("r1"), PublicKey: pubKey("key-2"), NotBefore: now, NotAfter: now.Add(time.Hour), IssuedAt: now}}
			_, err := s.CommitRenewal(ctx, r)
			mustNil(t, "CommitRenewal", err)
			if got := head(t, ctx, s); got != 1 {
				t.Fatalf("audit head after a renewal = %d, want 1", got)
			}
			if _, err := s.CommitRenewal(ctx, r); !errors.Is(err, store.ErrConflict) {
				t.Fatalf("second renewal from generation 0 = %v, want ErrConflict", err)
			}
			if got := head(t, ctx, s); got != 1 {
				t.Fatalf("audit head after a refused renewal = %d, want 1", got)
			}
		}},
	}
}
