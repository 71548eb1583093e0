package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// bkToken is a bound-keypair token for node, with a registration secret
// and no bound key yet.
func bkToken(name, node string, limit int64, mode string) store.Token {
	return store.Token{
		ID: name, JoinMethod: store.JoinMethodBoundKeypair, Ciphertext: []byte{}, Nonce: []byte{},
		NodeID: node, Labels: map[string]string{}, CreatedBy: "admin", CreatedAt: at(0),
		BoundKeypair: &store.BoundKeypair{
			Spec:             store.BoundKeypairSpec{RecoveryLimit: limit, RecoveryMode: mode},
			SecretCiphertext: []byte("sealed-secret-" + name), SecretNonce: []byte("nonce-" + name),
		},
	}
}

// bkJoin is a bound-keypair join of node through token name, creating
// instance, with the given claims.
func bkJoin(name, node, instance string, now time.Time, claims ...store.Claim) store.Join {
	j := newJoin(name, node, instance, "cert-key-"+instance, now)
	j.Instance.JoinMethod, j.Certificate.JoinMethod = store.JoinMethodBoundKeypair, store.JoinMethodBoundKeypair
	j.MaySupersede = true
	j.Claims = claims
	return j
}

func getBK(t *testing.T, ctx context.Context, s store.Store, name string) store.BoundKeypair {
	t.Helper()
	tok, err := s.GetToken(ctx, name)
	mustNil(t, "GetToken "+name, err)
	if tok.BoundKeypair == nil {
		t.Fatalf("token %s has no bound keypair", name)
	}
	return *tok.BoundKeypair
}

// register is the first join of a bound-keypair token: the key bound with
// the registration secret, and the first (counted) recovery.
func register(name, key string) []store.Claim {
	return []store.Claim{
		store.KeyBinding{TokenID: name, PublicKey: key, UseRegistrationSecret: true},
		store.Recovery{TokenID: name, ExpectedSequence: 0, Counted: true},
	}
}

func boundKeypairCases() []testCase {
	return []testCase{
		{"a bound-keypair token reads back with its spec and status; the cleaner leaves it", func(t *testing.T, ctx context.Context, s store.Store) {
			tok := bkToken("bot-1", "node-1", 2, store.RecoveryStandard)
			tok.ExpiresAt = at(-48 * time.Hour) // only an operator removes it
			tok.BoundKeypair.Spec.MustRegisterBefore = at(time.Hour)
			tok.BoundKeypair.Spec.RotateAfter = at(2 * time.Hour)
			insertTokens(t, ctx, s, tok, token("t1", 1, time.Time{}, time.Hour))
			got, err := s.GetToken(ctx, "bot-1")
			mustNil(t, "GetToken", err)
			wantEqual(t, "bound-keypair token", got, tok)
			plain, err := s.GetToken(ctx, "t1")
			mustNil(t, "GetToken t1", err)
			if plain.BoundKeypair != nil {
				t.Errorf("a join token has a bound keypair: %+v", plain.BoundKeypair)
			}
			ts, err := s.ListTokens(ctx)
			mustNil(t, "ListTokens", err)
			if len(ts) != 2 || ts[1].BoundKeypair == nil || ts[1].BoundKeypair.Spec.RecoveryLimit != 2 {
				t.Errorf("ListTokens = %+v", ts)
			}
			ids, err := s.DeleteExpiredTokens(ctx, 0, cleanupLink)
			mustNil(t, "DeleteExpiredTokens", err)
			if len(ids) != 0 {
				t.Errorf("DeleteExpiredTokens removed %v", ids)
			}
		}},
		{"only a bound-keypair token has a bound keypair", func(t *testing.T, ctx context.Context, s store.Store) {
			plain := token("t1", 1, time.Time{}, 0)
			plain.BoundKeypair = &store.BoundKeypair{Spec: store.BoundKeypairSpec{RecoveryMode: store.RecoveryStandard}}
			if err := s.InsertToken(ctx, plain, link(record("token.create"))); err == nil {
				t.Error("InsertToken of a join token with a bound keypair succeeded")
			}
			ts, err := s.ListTokens(ctx)
			mustNil(t, "ListTokens", err)
			if len(ts) != 0 {
				t.Errorf("tokens written: %+v", ts)
			}
		}},
		{"updating the spec leaves the status", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, bkToken("bot-1", "node-1", 1, store.RecoveryStandard), token("t1", 1, time.Time{}, 0))
			mustJoin(t, ctx, s, bkJoin("bot-1", "node-1", "i1", now, register("bot-1", "key-1")...))
			before := getBK(t, ctx, s, "bot-1")
			spec := store.BoundKeypairSpec{InitialPublicKey: "key-0", RecoveryLimit: 5, RecoveryMode: store.RecoveryRelaxed, RotateAfter: at(time.Hour)}
			got, err := s.UpdateBoundKeypairSpec(ctx, "bot-1", spec, "")
			mustNil(t, "UpdateBoundKeypairSpec", err)
			want := before
			want.Spec = spec
			wantEqual(t, "after the update", *got.BoundKeypair, want)
			wantEqual(t, "read back", getBK(t, ctx, s, "bot-1"), want)
			// The token's svid_usage is written with the spec, and back.
			got, err = s.UpdateBoundKeypairSpec(ctx, "bot-1", spec, store.SVIDUsageClientServer)
			mustNil(t, "UpdateBoundKeypairSpec client,server", err)
			if got.SVIDUsage != store.SVIDUsageClientServer {
				t.Errorf("after the update to client,server: usage %q", got.SVIDUsage)
			}
			wantEqual(t, "the spec after the usage's update", *got.BoundKeypair, want)
			if r, err := s.GetToken(ctx, "bot-1"); err != nil || r.SVIDUsage != store.SVIDUsageClientServer {
				t.Errorf("read back: usage %q, %v", r.SVIDUsage, err)
			}
			if got, err = s.UpdateBoundKeypairSpec(ctx, "bot-1", spec, ""); err != nil || got.SVIDUsage != "" {
				t.Errorf("back to client: usage %q, %v", got.SVIDUsage, err)
			}
			_, err = s.UpdateBoundKeypairSpec(ctx, "nope", spec, "")
			wantErr(t, "UpdateBoundKeypairSpec of an unknown token", err, store.ErrNotFound)
			_, err = s.UpdateBoundKeypairSpec(ctx, "t1", spec, "")
			wantErr(t, "UpdateBoundKeypairSpec of a join token", err, store.ErrNotFound)
		}},
		{"registration binds the key, uses the secret and counts the first recovery in one write", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, bkToken("bot-1", "node-1", 1, store.RecoveryStandard))
			mustJoin(t, ctx, s, bkJoin("bot-1", "node-1", "i1", now, register("bot-1", "key-1")...))
			bk := getBK(t, ctx, s, "bot-1")
			if bk.BoundPublicKey != "key-1" || bk.BoundInstanceID != "i1" || bk.RecoveryCount != 1 || bk.RecoverySequence != 1 ||
				bk.SecretCiphertext != nil || bk.SecretNonce != nil || bk.LastRecoveredAt.IsZero() || !bk.LastRotatedAt.IsZero() {
				t.Errorf("after registration: %+v", bk)
			}
			// The secret is spent: a second registration, even of another
			// node's join, binds nothing.
			before := snapshot(t, ctx, s, "node-1")
			_, err := s.CommitJoin(ctx, bkJoin("bot-1", "node-1", "i2", now, register("bot-1", "key-2")...))
			wantErr(t, "a second registration", err, store.ErrKeyBindingChanged)
			wantEqual(t, "after the refused registration", snapshot(t, ctx, s, "node-1"), before)
		}},
		{"registration after must_register_before is closed and writes nothing", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			tok := bkToken("bot-1", "node-1", 1, store.RecoveryStandard)
			tok.BoundKeypair.Spec.MustRegisterBefore = now.Add(-time.Second)
			insertTokens(t, ctx, s, tok)
			before := snapshot(t, ctx, s, "node-1")
			_, err := s.CommitJoin(ctx, bkJoin("bot-1", "node-1", "i1", now, register("bot-1", "key-1")...))
			wantErr(t, "a late registration", err, store.ErrRegistrationClosed)
			wantEqual(t, "after the late registration", snapshot(t, ctx, s, "node-1"), before)
		}},
		{"a registration secret already used is closed", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			tok := bkToken("bot-1", "node-1", 1, store.RecoveryStandard)
			tok.BoundKeypair.SecretCiphertext, tok.BoundKeypair.SecretNonce = nil, nil
			insertTokens(t, ctx, s, tok)
			_, err := s.CommitJoin(ctx, bkJoin("bot-1", "node-1", "i1", now, register("bot-1", "key-1")...))
			wantErr(t, "registration without a secret", err, store.ErrRegistrationClosed)
		}},
		{"a statically bound key joins without the secret", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			tok := bkToken("bot-1", "node-1", 1, store.RecoveryStandard)
			tok.BoundKeypair.Spec.InitialPublicKey, tok.BoundKeypair.BoundPublicKey = "key-1", "key-1"
			tok.BoundKeypair.SecretCiphertext, tok.BoundKeypair.SecretNonce = nil, nil
			insertTokens(t, ctx, s, tok)
			mustJoin(t, ctx, s, bkJoin("bot-1", "node-1", "i1", now, store.Recovery{TokenID: "bot-1", Counted: true}))
			if bk := getBK(t, ctx, s, "bot-1"); bk.RecoveryCount != 1 || bk.RecoverySequence != 1 || bk.BoundInstanceID != "i1" {
				t.Errorf("after the first join: %+v", bk)
			}
		}},
		{"standard recoveries stop at the limit; relaxed ones are not counted", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, bkToken("bot-1", "node-1", 1, store.RecoveryStandard))
			mustJoin(t, ctx, s, bkJoin("bot-1", "node-1", "i1", now, register("bot-1", "key-1")...))
			before := snapshot(t, ctx, s, "node-1")
			_, err := s.CommitJoin(ctx, bkJoin("bot-1", "node-1", "i2", now, store.Recovery{TokenID: "bot-1", ExpectedSequence: 1, Counted: true}))
			wantErr(t, "a recovery past the limit", err, store.ErrRecoveryExhausted)
			wantEqual(t, "after the refused recovery", snapshot(t, ctx, s, "node-1"), before)

			res := mustJoin(t, ctx, s, bkJoin("bot-1", "node-1", "i2", now, store.Recovery{TokenID: "bot-1", ExpectedSequence: 1}))
			if res.Superseded != "i1" {
				t.Errorf("relaxed recovery superseded %q, want i1", res.Superseded)
			}
			if bk := getBK(t, ctx, s, "bot-1"); bk.RecoveryCount != 1 || bk.RecoverySequence != 2 || bk.BoundInstanceID != "i2" {
				t.Errorf("after a relaxed recovery: %+v", bk)
			}
			// Raising the limit brings the exhausted token back.
			spec := getBK(t, ctx, s, "bot-1").Spec
			spec.RecoveryLimit = 2
			_, err = s.UpdateBoundKeypairSpec(ctx, "bot-1", spec, "")
			mustNil(t, "UpdateBoundKeypairSpec", err)
			mustJoin(t, ctx, s, bkJoin("bot-1", "node-1", "i3", now, store.Recovery{TokenID: "bot-1", ExpectedSequence: 2, Counted: true}))
			if bk := getBK(t, ctx, s, "bot-1"); bk.RecoveryCount != 2 || bk.RecoverySequence != 3 {
				t.Errorf("after raising the limit: %+v", bk)
			}
		}},
		{"a recovery from a stale sequence writes nothing", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, bkToken("bot-1", "node-1", 5, store.RecoveryStandard))
			mustJoin(t, ctx, s, bkJoin("bot-1", "node-1", "i1", now, register("bot-1", "key-1")...))
			before := snapshot(t, ctx, s, "node-1")
			_, err := s.CommitJoin(ctx, bkJoin("bot-1", "node-1", "i2", now, store.Recovery{TokenID: "bot-1", ExpectedSequence: 0, Counted: true}))
			wantErr(t, "a stale recovery", err, store.ErrRecoverySequenceChanged)
			wantEqual(t, "after the stale recovery", snapshot(t, ctx, s, "node-1"), before)
		}},
		{"a deleted token admits no recovery", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, bkToken("bot-1", "node-1", 5, store.RecoveryStandard))
			mustJoin(t, ctx, s, bkJoin("bot-1", "node-1", "i1", now, register("bot-1", "key-1")...))
			mustNil(t, "DeleteToken", s.DeleteToken(ctx, "bot-1", link(record("token.delete"))))
			j := bkJoin("bot-1", "node-1", "i2", now, store.Recovery{TokenID: "bot-1", ExpectedSequence: 1, Counted: true})
			_, err := s.CommitJoin(ctx, j)
			wantErr(t, "a recovery through a deleted token", err, store.ErrNotFound)
			j.TokenID, j.Instance.TokenID, j.Certificate.TokenID = "", "", ""
			j.Credential = "bot-1"
			_, err = s.CommitJoin(ctx, j)
			wantErr(t, "the recovery claim alone", err, store.ErrNotFound)
		}},
		{"a refresh's binding of the bound key to itself holds only while the token exists bound to it", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, bkToken("bot-1", "node-1", 1, store.RecoveryStandard))
			in := mustJoin(t, ctx, s, bkJoin("bot-1", "node-1", "i1", now, register("bot-1", "key-1")...)).Instance
			same := store.KeyBinding{TokenID: "bot-1", Expected: "key-1", PublicKey: "key-1"}

			r := renewalOf(in, "k2", now)
			r.Claims = []store.Claim{same}
			in, err := s.CommitRenewal(ctx, r)
			mustNil(t, "a refresh bound to the key it proved", err)
			if bk := getBK(t, ctx, s, "bot-1"); bk.BoundPublicKey != "key-1" || !bk.LastRotatedAt.IsZero() || bk.BoundInstanceID != "i1" {
				t.Errorf("a refresh's binding changed the token: %+v", bk)
			}

			stale := renewalOf(in, "k3", now)
			stale.FromGeneration = 1
			stale.Claims = []store.Claim{store.KeyBinding{TokenID: "bot-1", Expected: "key-0", PublicKey: "key-0"}}
			_, err = s.CommitRenewal(ctx, stale)
			wantErr(t, "a refresh that proved a key no longer bound", err, store.ErrKeyBindingChanged)

			mustNil(t, "DeleteToken", s.DeleteToken(ctx, "bot-1", link(record("token.delete"))))
			gone := renewalOf(in, "k3", now)
			gone.FromGeneration = 1
			gone.Claims = []store.Claim{same}
			_, err = s.CommitRenewal(ctx, gone)
			wantErr(t, "a refresh through a deleted token", err, store.ErrNotFound)
			if got, _ := s.GetInstance(ctx, "i1"); got.Generation != 1 {
				t.Errorf("a refused refresh left generation %d, want 1", got.Generation)
			}
		}},
		{"a rotation is won in the renewal's write, from the bound key only", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, bkToken("bot-1", "node-1", 1, store.RecoveryStandard))
			in := mustJoin(t, ctx, s, bkJoin("bot-1", "node-1", "i1", now, register("bot-1", "key-1")...)).Instance

			wrong := renewalOf(in, "k2", now)
			wrong.Claims = []store.Claim{store.KeyBinding{TokenID: "bot-1", Expected: "key-0", PublicKey: "key-2", Rotate: true}}
			_, err := s.CommitRenewal(ctx, wrong)
			wantErr(t, "a rotation from a key not bound", err, store.ErrKeyBindingChanged)
			if got, _ := s.GetInstance(ctx, "i1"); got.Generation != 0 {
				t.Errorf("a refused rotation advanced the generation to %d", got.Generation)
			}

			r := renewalOf(in, "k2", now)
			r.Claims = []store.Claim{store.KeyBinding{TokenID: "bot-1", Expected: "key-1", PublicKey: "key-2", Rotate: true}}
			_, err = s.CommitRenewal(ctx, r)
			mustNil(t, "CommitRenewal with a rotation", err)
			bk := getBK(t, ctx, s, "bot-1")
			if bk.BoundPublicKey != "key-2" || bk.LastRotatedAt.IsZero() || bk.BoundInstanceID != "i1" || bk.RecoverySequence != 1 {
				t.Errorf("after the rotation: %+v", bk)
			}
			rec := renewalOf(in, "k3", now)
			rec.FromGeneration = 1
			rec.Claims = []store.Claim{store.Recovery{TokenID: "bot-1", ExpectedSequence: 1}}
			if _, err := s.CommitRenewal(ctx, rec); err == nil {
				t.Error("a renewal carried a recovery")
			}
		}},
		{"recoveries racing rotating renewals of the instance they replace: one outcome each, no deadlock", func(t *testing.T, ctx context.Context, s store.Store) {
			// A recovery claims the token's row and then supersedes the
			// node's instance; a renewal that rotates the bound key holds
			// that instance's row and then claims the token's. Taken in
			// those orders the two would wait on each other; each must
			// end in its own outcome, never in an error of the database.
			// Round after round, one of each races from the same state.
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, bkToken("bot-1", "node-1", 1000, store.RecoveryStandard))
			cur := mustJoin(t, ctx, s, bkJoin("bot-1", "node-1", "i0", now, register("bot-1", "key-0")...)).Instance
			for round := range 40 {
				bk := getBK(t, ctx, s, "bot-1")
				errs := concurrently(2, func(i int) error {
					if i == 0 {
						_, err := s.CommitJoin(ctx, bkJoin("bot-1", "node-1", fmt.Sprintf("i%d", round+1), now,
							store.Recovery{TokenID: "bot-1", ExpectedSequence: bk.RecoverySequence, Counted: true}))
						return err
					}
					r := renewalOf(cur, fmt.Sprintf("k%d", round), now)
					r.Claims = []store.Claim{store.KeyBinding{TokenID: "bot-1", Expected: bk.BoundPublicKey,
						PublicKey: fmt.Sprintf("key-%d", round+1), Rotate: true}}
					_, err := s.CommitRenewal(ctx, r)
					return err
				})
				if errs[0] != nil {
					t.Fatalf("round %d: the recovery: %v", round, errs[0])
				}
				if err := errs[1]; err != nil && !errors.Is(err, store.ErrConflict) {
					t.Fatalf("round %d: the renewal: %v, want success or a conflict", round, err)
				}
				in, err := s.GetInstance(ctx, fmt.Sprintf("i%d", round+1))
				mustNil(t, "GetInstance", err)
				cur = in
			}
		}},
		{"8 racing rotating refreshes of one instance: one renews it and binds its key", func(t *testing.T, ctx context.Context, s store.Store) {
			// Each renews the instance from generation 0 and rotates the
			// bound key in the same write; the renewal's conditional write
			// and the binding's are one transaction, so the winner's key
			// is bound and the losers leave nothing.
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, bkToken("bot-1", "node-1", 100, store.RecoveryStandard))
			in := mustJoin(t, ctx, s, bkJoin("bot-1", "node-1", "i0", now, register("bot-1", "key-0")...)).Instance
			errs := concurrently(8, func(i int) error {
				r := renewalOf(in, "k"+string(rune('a'+i)), now)
				r.Claims = []store.Claim{store.KeyBinding{TokenID: "bot-1", Expected: "key-0",
					PublicKey: "key-" + string(rune('a'+i)), Rotate: true}}
				_, err := s.CommitRenewal(ctx, r)
				return err
			})
			ok, lost := tally(t, errs, store.ErrConflict)
			if ok != 1 || lost != 7 {
				t.Fatalf("%d refreshes won and %d lost, want 1 and 7", ok, lost)
			}
			winner := slices.IndexFunc(errs, func(err error) bool { return err == nil })
			got, err := s.GetInstance(ctx, "i0")
			mustNil(t, "GetInstance", err)
			want := renewed(in, renewalOf(in, "k"+string(rune('a'+winner)), now))
			if got.Generation != 1 || got.LastSerial != want.LastSerial {
				t.Errorf("instance after the race: generation %d, serial %s; want 1, %s", got.Generation, got.LastSerial, want.LastSerial)
			}
			if bk := getBK(t, ctx, s, "bot-1"); bk.BoundPublicKey != "key-"+string(rune('a'+winner)) || bk.LastRotatedAt.IsZero() {
				t.Errorf("after the race: bound %q, want the winner's key-%c: %+v", bk.BoundPublicKey, rune('a'+winner), bk)
			}
		}},
		{"8 racing rotations from one bound key: exactly one key is bound", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, bkToken("bot-1", "node-1", 100, store.RecoveryStandard))
			mustJoin(t, ctx, s, bkJoin("bot-1", "node-1", "i0", now, register("bot-1", "key-1")...))
			errs := concurrently(8, func(i int) error {
				_, err := s.CommitJoin(ctx, bkJoin("bot-1", "node-1", "r"+string(rune('a'+i)), now,
					store.KeyBinding{TokenID: "bot-1", Expected: "key-1", PublicKey: "key-" + string(rune('a'+i)), Rotate: true}))
				return err
			})
			ok, lost := tally(t, errs, store.ErrKeyBindingChanged)
			if ok != 1 || lost != 7 {
				t.Fatalf("%d rotations won and %d lost, want 1 and 7", ok, lost)
			}
			bk := getBK(t, ctx, s, "bot-1")
			if bk.BoundPublicKey == "key-1" || len(bk.BoundPublicKey) != len("key-a") || bk.LastRotatedAt.IsZero() ||
				bk.BoundInstanceID != "r"+bk.BoundPublicKey[len("key-"):] {
				t.Errorf("after the race: %+v", bk)
			}
		}},
		{"8 racing recoveries from one join state: exactly one wins", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, bkToken("bot-1", "node-1", 100, store.RecoveryStandard))
			mustJoin(t, ctx, s, bkJoin("bot-1", "node-1", "i0", now, register("bot-1", "key-1")...))
			errs := concurrently(8, func(i int) error {
				_, err := s.CommitJoin(ctx, bkJoin("bot-1", "node-1", "r"+string(rune('a'+i)), now,
					store.Recovery{TokenID: "bot-1", ExpectedSequence: 1, Counted: true}))
				return err
			})
			ok, lost := tally(t, errs, store.ErrRecoverySequenceChanged)
			if ok != 1 || lost != 7 {
				t.Fatalf("%d recoveries won and %d lost, want 1 and 7", ok, lost)
			}
			bk := getBK(t, ctx, s, "bot-1")
			if bk.RecoveryCount != 2 || bk.RecoverySequence != 2 {
				t.Errorf("after the race: count %d, sequence %d, want 2 and 2", bk.RecoveryCount, bk.RecoverySequence)
			}
			ins, err := s.ListInstances(ctx, "node-1")
			mustNil(t, "ListInstances", err)
			current := 0
			for _, in := range ins {
				if in.State == store.InstanceCurrent {
					current++
					if in.ID != bk.BoundInstanceID {
						t.Errorf("current instance %s, bound instance %s", in.ID, bk.BoundInstanceID)
					}
				}
			}
			if len(ins) != 2 || current != 1 {
				t.Errorf("instances %+v, want the first and the winner", ins)
			}
		}},
		{"8 racing registrations with one secret: exactly one key is bound", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, bkToken("bot-1", "node-1", 100, store.RecoveryStandard))
			errs := concurrently(8, func(i int) error {
				key := "key-" + string(rune('a'+i))
				_, err := s.CommitJoin(ctx, bkJoin("bot-1", "node-1", "i"+key, now, register("bot-1", key)...))
				return err
			})
			ok, lost := 0, 0
			for i, err := range errs {
				switch {
				case err == nil:
					ok++
				// A loser finds the key bound (or, on a backend that
				// serializes on the node first, the sequence moved).
				case errors.Is(err, store.ErrKeyBindingChanged), errors.Is(err, store.ErrRecoverySequenceChanged):
					lost++
				default:
					t.Errorf("registration %d: %v", i, err)
				}
			}
			if ok != 1 || lost != 7 {
				t.Fatalf("%d registrations won and %d lost, want 1 and 7", ok, lost)
			}
			if bk := getBK(t, ctx, s, "bot-1"); bk.RecoveryCount != 1 || bk.SecretCiphertext != nil {
				t.Errorf("after the race: %+v", bk)
			}
		}},
	}
}

func joinStateKeyCases() []testCase {
	return []testCase{
		{"join-state keys are kept, newest first, once per ID", func(t *testing.T, ctx context.Context, s store.Store) {
			ks, err := s.ListJoinStateKeys(ctx)
			mustNil(t, "ListJoinStateKeys", err)
			if len(ks) != 0 {
				t.Fatalf("a fresh store has keys: %+v", ks)
			}
			old := store.JoinStateKey{ID: "js-1", PublicKey: []byte{1}, Ciphertext: []byte{2}, Nonce: []byte{3}, CreatedAt: at(-time.Hour)}
			cur := store.JoinStateKey{ID: "js-2", PublicKey: []byte{4}, Ciphertext: []byte{5}, Nonce: []byte{6}, CreatedAt: at(0)}
			mustNil(t, "InsertJoinStateKey old", s.InsertJoinStateKey(ctx, old))
			mustNil(t, "InsertJoinStateKey current", s.InsertJoinStateKey(ctx, cur))
			wantErr(t, "InsertJoinStateKey again", s.InsertJoinStateKey(ctx, old), store.ErrConflict)
			ks, err = s.ListJoinStateKeys(ctx)
			mustNil(t, "ListJoinStateKeys", err)
			wantEqual(t, "keys", ks, []store.JoinStateKey{cur, old})
		}},
		{"a join-state key in a token: an empty nonce and its URI", func(t *testing.T, ctx context.Context, s store.Store) {
			uri := []byte("pkcs11:token=muster;object=muster-join-state%2Fjs-1;id=%01%02")
			k := store.JoinStateKey{ID: "js-1", PublicKey: []byte{1}, Ciphertext: uri, Nonce: []byte{}, CreatedAt: at(0)}
			mustNil(t, "InsertJoinStateKey", s.InsertJoinStateKey(ctx, k))
			ks, err := s.ListJoinStateKeys(ctx)
			mustNil(t, "ListJoinStateKeys", err)
			if len(ks) != 1 || len(ks[0].Nonce) != 0 || string(ks[0].Ciphertext) != string(uri) {
				t.Fatalf("read back: %+v", ks)
			}
		}},
	}
}
