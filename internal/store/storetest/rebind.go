package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// rebind is the claims of a resync that also rebinds the token's key (an
// agent that rotated or registered after the backup): the key binding,
// from the key the store holds, and the resync, in one write.
func rebind(name, from, to string, seq int64, epoch string) []store.Claim {
	return []store.Claim{
		store.KeyBinding{TokenID: name, Expected: from, PublicKey: to, Rotate: from != "", DropRegistrationSecret: from == ""},
		store.Recovery{TokenID: name, ExpectedSequence: seq, Epoch: epoch, Sequence: seq + 1, Resync: true},
	}
}

func rebindCases() []testCase {
	return []testCase{
		{"a rebinding resync moves the key and the sequence together, only inside a window", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, bkToken("bot-1", "node-1", 100, store.RecoveryStandard))
			mustJoin(t, ctx, s, bkJoin("bot-1", "node-1", "i0", now, register("bot-1", "key-1")...))
			before := snapshot(t, ctx, s, "node-1")
			_, err := s.CommitJoin(ctx, bkJoin("bot-1", "node-1", "i1", now, rebind("bot-1", "key-1", "key-2", 1, "ep-1")...))
			wantErr(t, "a rebind with no window", err, store.ErrResyncClosed)
			_, err = s.OpenResync(ctx, openResync("ep-1", time.Hour), epochLink("bound_keypair.resync.open"))
			mustNil(t, "OpenResync", err)
			_, err = s.CommitJoin(ctx, bkJoin("bot-1", "node-1", "i1", now, rebind("bot-1", "key-0", "key-2", 1, "ep-1")...))
			wantErr(t, "a rebind from a key not bound", err, store.ErrKeyBindingChanged)
			_, err = s.CommitJoin(ctx, bkJoin("bot-1", "node-1", "i1", now, rebind("bot-1", "key-1", "key-2", 0, "ep-1")...))
			wantErr(t, "a rebind from a sequence that moved", err, store.ErrRecoverySequenceChanged)
			wantEqual(t, "after the refused rebinds", snapshot(t, ctx, s, "node-1"), before)

			mustJoin(t, ctx, s, bkJoin("bot-1", "node-1", "i1", now, rebind("bot-1", "key-1", "key-2", 1, "ep-1")...))
			bk := getBK(t, ctx, s, "bot-1")
			if bk.BoundPublicKey != "key-2" || bk.LastRotatedAt.IsZero() || bk.RecoverySequence != 2 || bk.Epoch != "ep-1" ||
				bk.RecoveryCount != 1 || bk.BoundInstanceID != "i1" {
				t.Errorf("after the rebind: %+v", bk)
			}
		}},
		{"a rebinding resync binds a token restored from before its registration and drops the restored secret", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, bkToken("bot-1", "node-1", 100, store.RecoveryStandard))
			_, err := s.OpenResync(ctx, openResync("ep-1", time.Hour), epochLink("bound_keypair.resync.open"))
			mustNil(t, "OpenResync", err)
			mustJoin(t, ctx, s, bkJoin("bot-1", "node-1", "i1", now, rebind("bot-1", "", "key-2", 0, "ep-1")...))
			bk := getBK(t, ctx, s, "bot-1")
			if bk.BoundPublicKey != "key-2" || bk.RecoverySequence != 1 || bk.Epoch != "ep-1" || bk.RecoveryCount != 0 || bk.BoundInstanceID != "i1" ||
				bk.SecretCiphertext != nil || bk.SecretNonce != nil {
				t.Errorf("after the rebind: %+v", bk)
			}
			_, err = s.CommitJoin(ctx, bkJoin("bot-1", "node-1", "i2", now, rebind("bot-1", "", "key-3", 1, "ep-1")...))
			wantErr(t, "a second rebind from no key", err, store.ErrKeyBindingChanged)
		}},
		{"8 racing rebinding resyncs of one token: exactly one binds its key", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, bkToken("bot-1", "node-1", 100, store.RecoveryStandard))
			mustJoin(t, ctx, s, bkJoin("bot-1", "node-1", "i0", now, register("bot-1", "key-1")...))
			_, err := s.OpenResync(ctx, openResync("ep-1", time.Hour), epochLink("bound_keypair.resync.open"))
			mustNil(t, "OpenResync", err)
			errs := concurrently(8, func(i int) error {
				_, err := s.CommitJoin(ctx, bkJoin("bot-1", "node-1", fmt.Sprintf("r%d", i), now,
					rebind("bot-1", "key-1", fmt.Sprintf("key-r%d", i), 1, "ep-1")...))
				return err
			})
			ok, lost := tally(t, errs, store.ErrKeyBindingChanged)
			if ok != 1 || lost != 7 {
				t.Fatalf("%d rebinds won and %d lost, want 1 and 7", ok, lost)
			}
			bk := getBK(t, ctx, s, "bot-1")
			if bk.RecoverySequence != 2 || bk.Epoch != "ep-1" || bk.BoundPublicKey != "key-"+bk.BoundInstanceID {
				t.Errorf("after the race: %+v", bk)
			}
		}},
	}
}
