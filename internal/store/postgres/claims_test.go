package postgres

import (
	"context"
	"crypto/sha256"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
)

// testJoin is a complete join of node through token (of method) creating
// instance, with claims; its certificate key is the instance's.
func testJoin(method, token, node, instance string, now time.Time, claims ...store.Claim) store.Join {
	k := sha256.Sum256([]byte(instance))
	return store.Join{TokenID: token, NodeID: node, MaySupersede: method == store.JoinMethodBoundKeypair, Claims: claims,
		Instance: store.Instance{ID: instance, JoinMethod: method, TokenID: token, CreatedAt: now,
			LastSerial: "5e" + instance, LastPublicKey: k[:], LastChainPEM: []byte("chain"), LastIssuedAt: now},
		Certificate: store.Certificate{Serial: "5e" + instance, NodeID: node, InstanceID: instance, JoinMethod: method,
			TokenID: token, PublicKey: k[:], NotBefore: now, NotAfter: now.Add(time.Hour), IssuedAt: now}}
}

// joinedBot stores bound-keypair token bot-1 with key-0 bound, and its
// first instance i0 for node bot-1 (recovery sequence 1).
func joinedBot(t *testing.T, s *Store, now time.Time) {
	t.Helper()
	ctx := t.Context()
	if err := s.InsertToken(ctx, store.Token{ID: "bot-1", JoinMethod: store.JoinMethodBoundKeypair, Ciphertext: []byte{},
		Nonce: []byte{}, NodeID: "bot-1", CreatedBy: "test", CreatedAt: now, BoundKeypair: &store.BoundKeypair{
			Spec: store.BoundKeypairSpec{RecoveryLimit: 10, RecoveryMode: store.RecoveryStandard}, BoundPublicKey: "key-0"}}, benchLink); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CommitJoin(ctx, testJoin(store.JoinMethodBoundKeypair, "bot-1", "bot-1", "i0", now,
		store.Recovery{TokenID: "bot-1", Counted: true})); err != nil {
		t.Fatal(err)
	}
}

// TestLostClaimReasons has a concurrent transaction hold the row a claim
// needs, change it, and commit while the claim waits on its lock: the
// claim fails, and is refused with the reason of the row as that
// transaction left it, not as the claim's statement first saw it. A token
// deleted during a join was refused as spent before the reason was read
// again after the rollback.
func TestLostClaimReasons(t *testing.T) {
	ctx := t.Context()
	setup := func(t *testing.T, s *Store, now time.Time) {
		t.Helper()
		if err := s.InsertToken(ctx, store.Token{ID: "tok-1", JoinMethod: store.JoinMethodToken, Ciphertext: []byte{}, Nonce: []byte{},
			UsesAllowed: 2, CreatedBy: "test", CreatedAt: now}, benchLink); err != nil {
			t.Fatal(err)
		}
		joinedBot(t, s, now)
	}
	join := func(claims ...store.Claim) func(*Store, time.Time) error {
		return func(s *Store, now time.Time) error {
			j := testJoin(store.JoinMethodBoundKeypair, "bot-1", "bot-1", "i1", now, claims...)
			if _, ok := claims[0].(store.TokenUse); ok {
				j = testJoin(store.JoinMethodToken, "tok-1", "node-1", "i1", now, claims...)
			}
			_, err := s.CommitJoin(ctx, j)
			return err
		}
	}
	renewal := func(claims ...store.Claim) func(*Store, time.Time) error {
		return func(s *Store, now time.Time) error {
			k := sha256.Sum256([]byte("r1"))
			_, err := s.CommitRenewal(ctx, store.Renewal{InstanceID: "i0", FromGeneration: 0, ChainPEM: []byte("chain"), Claims: claims,
				Certificate: store.Certificate{Serial: "5e11", Generation: 1, PublicKey: k[:], NotBefore: now,
					NotAfter: now.Add(time.Hour), IssuedAt: now}})
			return err
		}
	}
	recovery := store.Recovery{TokenID: "bot-1", ExpectedSequence: 1, Counted: true}
	rotation := store.KeyBinding{TokenID: "bot-1", Expected: "key-0", PublicKey: "key-1", Rotate: true}
	for _, tc := range []struct {
		name string
		// concurrent runs in the transaction that holds the row.
		concurrent string
		claim      func(*Store, time.Time) error
		want       error
	}{
		{"token deleted during a join", `DELETE FROM tokens WHERE id = 'tok-1'`,
			join(store.TokenUse{TokenID: "tok-1"}), store.ErrNotFound},
		{"token used up during a join", `UPDATE tokens SET uses_count = uses_allowed WHERE id = 'tok-1'`,
			join(store.TokenUse{TokenID: "tok-1"}), store.ErrTokenSpent},
		{"bound key rotated during a rotating join", `UPDATE bound_keypairs SET bound_public_key = 'key-x' WHERE token_id = 'bot-1'`,
			join(rotation, recovery), store.ErrKeyBindingChanged},
		{"recovery won during a recovery", `UPDATE bound_keypairs SET recovery_sequence = 2 WHERE token_id = 'bot-1'`,
			join(recovery), store.ErrRecoverySequenceChanged},
		{"budget spent during a recovery", `UPDATE bound_keypairs SET recovery_limit = 1 WHERE token_id = 'bot-1'`,
			join(recovery), store.ErrRecoveryExhausted},
		// The join's token use comes first and is the claim that loses.
		{"bound-keypair token deleted during a recovering join", `DELETE FROM tokens WHERE id = 'bot-1'`,
			join(recovery), store.ErrNotFound},
		// Nothing comes before the key binding: its own lost write answers.
		{"bound-keypair token deleted during a rotating refresh", `DELETE FROM tokens WHERE id = 'bot-1'`,
			renewal(rotation), store.ErrNotFound},
		{"bound key rotated during a rotating refresh", `UPDATE bound_keypairs SET bound_public_key = 'key-x' WHERE token_id = 'bot-1'`,
			renewal(rotation), store.ErrKeyBindingChanged},
		{"instance renewed during a renewal", `UPDATE instances SET generation = 1 WHERE id = 'i0'`,
			renewal(), store.ErrConflict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := openFresh(t)
			now, err := s.Now(ctx)
			if err != nil {
				t.Fatal(err)
			}
			now = now.UTC().Truncate(time.Microsecond)
			setup(t, s, now)
			holder, err := s.pool.p.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Rollback(context.WithoutCancel(ctx))
			if _, err := holder.Exec(ctx, tc.concurrent); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- tc.claim(s, now) }()
			waitForLockWait(t, s)
			if err := holder.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-done; !errors.Is(err, tc.want) {
				t.Fatalf("claim = %v, want %v", err, tc.want)
			}
			// Nothing of the refused request stays: no instance i1, and
			// the connection it used is out of its transaction.
			if _, err := s.GetInstance(ctx, "i1"); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("GetInstance i1 after the refusal: %v", err)
			}
		})
	}
}

// waitForLockWait returns once a session of s's database waits on a lock.
func waitForLockWait(t *testing.T, s *Store) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := s.pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no session waited on the held row")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// tripCounter counts round trips: each query, and each batch however many
// statements it carries.
type tripCounter struct{ n atomic.Int64 }

func (c *tripCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *tripCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *tripCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *tripCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *tripCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// TestRefusedWriteRoundTrips: a renewal that lost its race, and a join
// whose key binding lost, are refused in two round trips: the batch, then
// the rollback with the read that says why. The renewal took three (the
// batch, the read inside the transaction, holding the audit chain's lock,
// then the rollback), and the binding four (its batch, its UPDATE, its
// read, the rollback).
func TestRefusedWriteRoundTrips(t *testing.T) {
	ctx := t.Context()
	trips := &tripCounter{}
	s, err := Open(ctx, srv.NewDatabase(t), WithTracer(trips))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now, err := s.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	now = now.UTC().Truncate(time.Microsecond)
	joinedBot(t, s, now)
	audit := func(h store.AuditHead) (store.AuditRecord, error) {
		return store.AuditRecord{Seq: h.Seq + 1, Time: now, Actor: "test", Action: "test", Result: "ok", PrevHash: h.Hash,
			Hash: make([]byte, 32)}, nil
	}
	for _, tc := range []struct {
		name string
		run  func() error
		want error
	}{
		{"renewal from a generation passed", func() error {
			k := sha256.Sum256([]byte("r1"))
			_, err := s.CommitRenewal(ctx, store.Renewal{InstanceID: "i0", FromGeneration: 3, ChainPEM: []byte("chain"), Audit: audit,
				Certificate: store.Certificate{Serial: "5e11", Generation: 4, PublicKey: k[:], NotBefore: now,
					NotAfter: now.Add(time.Hour), IssuedAt: now}})
			return err
		}, store.ErrConflict},
		{"recovery rotating from a key no longer bound", func() error {
			_, err := s.CommitJoin(ctx, testJoin(store.JoinMethodBoundKeypair, "bot-1", "bot-1", "i1", now,
				store.KeyBinding{TokenID: "bot-1", Expected: "key-x", PublicKey: "key-1", Rotate: true},
				store.Recovery{TokenID: "bot-1", ExpectedSequence: 1, Counted: true}))
			return err
		}, store.ErrKeyBindingChanged},
	} {
		t.Run(tc.name, func(t *testing.T) {
			trips.n.Store(0)
			if err := tc.run(); !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if n := trips.n.Load(); n != 2 {
				t.Errorf("%d round trips, want 2", n)
			}
		})
	}
}
