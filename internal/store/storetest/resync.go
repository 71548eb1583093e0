package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

func openResync(id string, d time.Duration) store.ResyncOpen {
	return store.ResyncOpen{ID: id, For: d, OpenedBy: "admin:alice", Reason: "restored from backup"}
}

func resyncCases() []testCase {
	return []testCase{
		{"a window opens once, begins the next epoch, and closes", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			e, err := s.OpenResync(ctx, openResync("ep-1", time.Hour), epochLink("bound_keypair.resync.open"))
			mustNil(t, "OpenResync", err)
			if e.ID != "ep-1" || e.Ordinal != 1 || e.OpenedBy != "admin:alice" || e.Reason != "restored from backup" ||
				!e.OpenAt(now.Add(time.Minute)) || e.OpenAt(now.Add(2*time.Hour)) || e.Until.Sub(e.OpenedAt) != time.Hour {
				t.Errorf("opened: %+v", e)
			}
			_, err = s.OpenResync(ctx, openResync("ep-2", time.Hour), epochLink("bound_keypair.resync.open"))
			wantErr(t, "opening while a window is open", err, store.ErrConflict)
			closed, err := s.CloseResync(ctx, "admin:bob", epochLink("bound_keypair.resync.close"))
			mustNil(t, "CloseResync", err)
			if closed.ID != "ep-1" || closed.ClosedAt.IsZero() || closed.ClosedBy != "admin:bob" || closed.OpenAt(now) {
				t.Errorf("closed: %+v", closed)
			}
			_, err = s.CloseResync(ctx, "admin:bob", epochLink("bound_keypair.resync.close"))
			wantErr(t, "closing with no window open", err, store.ErrNotFound)
			e2, err := s.OpenResync(ctx, openResync("ep-2", time.Hour), epochLink("bound_keypair.resync.open"))
			mustNil(t, "OpenResync after the close", err)
			if e2.Ordinal != 2 {
				t.Errorf("second epoch's ordinal = %d, want 2", e2.Ordinal)
			}
			list, err := s.ListResyncEpochs(ctx)
			mustNil(t, "ListResyncEpochs", err)
			if len(list) != 2 || list[0].ID != "ep-1" || list[1].ID != "ep-2" {
				t.Errorf("ListResyncEpochs = %+v", list)
			}
		}},
		{"an unaudited opening or closing changes nothing; an audited one writes its record", func(t *testing.T, ctx context.Context, s store.Store) {
			epochs := func() any {
				list, err := s.ListResyncEpochs(ctx)
				mustNil(t, "ListResyncEpochs", err)
				return list
			}
			// The record is built for the epoch as written.
			var built []store.ResyncEpoch
			with := func(audit func(store.AuditHead) (store.AuditRecord, error)) func(store.ResyncEpoch) func(store.AuditHead) (store.AuditRecord, error) {
				return func(e store.ResyncEpoch) func(store.AuditHead) (store.AuditRecord, error) {
					built = append(built, e)
					return audit
				}
			}
			wantUnaudited(t, ctx, s, "bound_keypair.resync.open", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
				_, err := s.OpenResync(ctx, openResync("ep-1", time.Hour), with(audit))
				return err
			}, epochs)
			if len(built) == 0 || built[0].ID != "ep-1" || built[0].Until.Sub(built[0].OpenedAt) != time.Hour {
				t.Fatalf("the opening's records were built for %+v; want ep-1, an hour long", built)
			}
			_, err := s.OpenResync(ctx, openResync("ep-1", time.Hour), with(nil))
			if err == nil {
				t.Fatal("OpenResync with a nil record succeeded")
			}
			_, err = s.OpenResync(ctx, openResync("ep-1", time.Hour), nil)
			if err == nil {
				t.Fatal("OpenResync with no audit succeeded")
			}
			wantEqual(t, "epochs after refused openings", epochs(), any([]store.ResyncEpoch(nil)))
			seq := auditSeq(t, ctx, s)
			e, err := s.OpenResync(ctx, openResync("ep-1", time.Hour), epochLink("bound_keypair.resync.open"))
			mustNil(t, "OpenResync with its record", err)
			wantAppended(t, ctx, s, seq, "bound_keypair.resync.open")
			built = nil
			wantUnaudited(t, ctx, s, "bound_keypair.resync.close", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
				_, err := s.CloseResync(ctx, "admin:bob", with(audit))
				return err
			}, epochs)
			if len(built) == 0 || built[0].ID != e.ID || built[0].ClosedAt.IsZero() || built[0].ClosedBy != "admin:bob" {
				t.Fatalf("the closing's records were built for %+v; want %s closed by admin:bob", built, e.ID)
			}
			seq = auditSeq(t, ctx, s)
			_, err = s.CloseResync(ctx, "admin:bob", epochLink("bound_keypair.resync.close"))
			mustNil(t, "CloseResync with its record", err)
			wantAppended(t, ctx, s, seq, "bound_keypair.resync.close")
			// A refused write (no window open) builds and writes no record.
			_, err = s.CloseResync(ctx, "admin:bob", func(store.ResyncEpoch) func(store.AuditHead) (store.AuditRecord, error) {
				t.Error("CloseResync with no window open asked for a record")
				return link(record("bound_keypair.resync.close"))
			})
			wantErr(t, "CloseResync with no window open", err, store.ErrNotFound)
			wantAppended(t, ctx, s, seq, "bound_keypair.resync.close")
		}},
		{"an expired window counts as closed", func(t *testing.T, ctx context.Context, s store.Store) {
			_, err := s.OpenResync(ctx, openResync("ep-1", time.Microsecond), epochLink("bound_keypair.resync.open"))
			mustNil(t, "OpenResync", err)
			time.Sleep(5 * time.Millisecond)
			_, err = s.CloseResync(ctx, "admin:bob", epochLink("bound_keypair.resync.close"))
			wantErr(t, "closing an expired window", err, store.ErrNotFound)
			_, err = s.OpenResync(ctx, openResync("ep-2", time.Hour), epochLink("bound_keypair.resync.open"))
			mustNil(t, "OpenResync after the expiry", err)
		}},
		{"8 racing openings: exactly one epoch begins", func(t *testing.T, ctx context.Context, s store.Store) {
			errs := concurrently(8, func(i int) error {
				_, err := s.OpenResync(ctx, openResync(fmt.Sprintf("ep-%d", i), time.Hour), epochLink("bound_keypair.resync.open"))
				return err
			})
			ok, lost := tally(t, errs, store.ErrConflict)
			if ok != 1 || lost != 7 {
				t.Fatalf("%d openings won and %d lost, want 1 and 7", ok, lost)
			}
			list, err := s.ListResyncEpochs(ctx)
			mustNil(t, "ListResyncEpochs", err)
			if len(list) != 1 || list[0].Ordinal != 1 {
				t.Errorf("epochs after the race: %+v", list)
			}
		}},
		{"a recovery records its epoch and expects the token's", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, bkToken("bot-1", "node-1", 100, store.RecoveryStandard))
			mustJoin(t, ctx, s, bkJoin("bot-1", "node-1", "i0", now, register("bot-1", "key-1")...))
			if bk := getBK(t, ctx, s, "bot-1"); bk.Epoch != "" {
				t.Fatalf("epoch before any window = %q", bk.Epoch)
			}
			_, err := s.CommitJoin(ctx, bkJoin("bot-1", "node-1", "i1", now,
				store.Recovery{TokenID: "bot-1", ExpectedSequence: 1, ExpectedEpoch: "ep-x", Epoch: "ep-1"}))
			wantErr(t, "a recovery expecting another epoch", err, store.ErrRecoverySequenceChanged)
			mustJoin(t, ctx, s, bkJoin("bot-1", "node-1", "i1", now,
				store.Recovery{TokenID: "bot-1", ExpectedSequence: 1, Epoch: "ep-1"}))
			if bk := getBK(t, ctx, s, "bot-1"); bk.Epoch != "ep-1" || bk.RecoverySequence != 2 || bk.BoundInstanceID != "i1" {
				t.Errorf("after the recovery: %+v", bk)
			}
		}},
		{"a resync brings the sequence forward only while its window is open", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, bkToken("bot-1", "node-1", 100, store.RecoveryStandard))
			mustJoin(t, ctx, s, bkJoin("bot-1", "node-1", "i0", now, register("bot-1", "key-1")...))
			resync := store.Recovery{TokenID: "bot-1", ExpectedSequence: 1, Epoch: "ep-1", Sequence: 8, Resync: true}

			before := snapshot(t, ctx, s, "node-1")
			_, err := s.CommitJoin(ctx, bkJoin("bot-1", "node-1", "i1", now, resync))
			wantErr(t, "a resync with no window", err, store.ErrResyncClosed)
			_, err = s.OpenResync(ctx, openResync("ep-1", time.Hour), epochLink("bound_keypair.resync.open"))
			mustNil(t, "OpenResync", err)
			_, err = s.CloseResync(ctx, "admin:bob", epochLink("bound_keypair.resync.close"))
			mustNil(t, "CloseResync", err)
			_, err = s.CommitJoin(ctx, bkJoin("bot-1", "node-1", "i1", now, resync))
			wantErr(t, "a resync after the close", err, store.ErrResyncClosed)
			wantEqual(t, "after the refused resyncs", snapshot(t, ctx, s, "node-1"), before)

			_, err = s.OpenResync(ctx, openResync("ep-2", time.Hour), epochLink("bound_keypair.resync.open"))
			mustNil(t, "OpenResync", err)
			resync.Epoch = "ep-2"
			mustJoin(t, ctx, s, bkJoin("bot-1", "node-1", "i1", now, resync))
			bk := getBK(t, ctx, s, "bot-1")
			if bk.Epoch != "ep-2" || bk.RecoverySequence != 8 || bk.RecoveryCount != 1 || bk.BoundInstanceID != "i1" {
				t.Errorf("after the resync: %+v", bk)
			}
		}},
		{"8 racing resyncs of one token: exactly one brings it forward", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, bkToken("bot-1", "node-1", 100, store.RecoveryStandard))
			mustJoin(t, ctx, s, bkJoin("bot-1", "node-1", "i0", now, register("bot-1", "key-1")...))
			_, err := s.OpenResync(ctx, openResync("ep-1", time.Hour), epochLink("bound_keypair.resync.open"))
			mustNil(t, "OpenResync", err)
			errs := concurrently(8, func(i int) error {
				_, err := s.CommitJoin(ctx, bkJoin("bot-1", "node-1", "r"+string(rune('a'+i)), now,
					store.Recovery{TokenID: "bot-1", ExpectedSequence: 1, Epoch: "ep-1", Sequence: int64(5 + i), Resync: true}))
				return err
			})
			ok, lost := tally(t, errs, store.ErrRecoverySequenceChanged)
			if ok != 1 || lost != 7 {
				t.Fatalf("%d resyncs won and %d lost, want 1 and 7", ok, lost)
			}
			bk := getBK(t, ctx, s, "bot-1")
			if bk.Epoch != "ep-1" || bk.RecoverySequence < 5 || bk.RecoverySequence > 12 ||
				bk.BoundInstanceID != "r"+string(rune('a'+bk.RecoverySequence-5)) {
				t.Errorf("after the race: %+v", bk)
			}
		}},
		{"a resync racing the window's close: it wins only before the close", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			for i := range 8 {
				name := fmt.Sprintf("bot-%d", i)
				insertTokens(t, ctx, s, bkToken(name, "node-"+name, 100, store.RecoveryStandard))
				mustJoin(t, ctx, s, bkJoin(name, "node-"+name, "i0-"+name, now, register(name, "key-"+name)...))
			}
			_, err := s.OpenResync(ctx, openResync("ep-1", time.Hour), epochLink("bound_keypair.resync.open"))
			mustNil(t, "OpenResync", err)
			// Each resync either commits before the close or finds it.
			errs := concurrently(9, func(i int) error {
				if i == 8 {
					_, err := s.CloseResync(ctx, "admin:bob", epochLink("bound_keypair.resync.close"))
					return err
				}
				name := fmt.Sprintf("bot-%d", i)
				_, err := s.CommitJoin(ctx, bkJoin(name, "node-"+name, "i1-"+name, now,
					store.Recovery{TokenID: name, ExpectedSequence: 1, Epoch: "ep-1", Sequence: 6, Resync: true}))
				return err
			})
			ok, closed := tally(t, errs, store.ErrResyncClosed)
			if ok+closed != 9 || errs[8] != nil {
				t.Fatalf("%d won and %d found the window closed; the close: %v", ok, closed, errs[8])
			}
			for i := range 8 {
				bk := getBK(t, ctx, s, fmt.Sprintf("bot-%d", i))
				won := errs[i] == nil
				if won && (bk.RecoverySequence != 6 || bk.Epoch != "ep-1") || !won && (bk.RecoverySequence != 1 || bk.Epoch != "") {
					t.Errorf("bot-%d (won %v): %+v", i, won, bk)
				}
			}
		}},
	}
}
