package postgres

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
)

// holdTokenUse takes a use of token id as a join does (its lock, then its
// statement) in a transaction it leaves open, rolled back when the test
// ends unless the caller commits it.
func holdTokenUse(t *testing.T, s *Store, id string) pgx.Tx {
	t.Helper()
	ctx := t.Context()
	tx, err := s.pool.p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctx, tokenUseLockQuery, tokenLockClass, id); err != nil {
		t.Fatal(err)
	}
	st := useToken(id)
	if err := st.read(tx.QueryRow(ctx, st.sql, st.args...)); err != nil {
		t.Fatalf("the held use: %v", err)
	}
	return tx
}

// lockWaiters counts the sessions of s's database waiting for a lock.
func lockWaiters(t *testing.T, s *Store) int {
	t.Helper()
	var n int
	if err := s.pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// awaitWaiters returns once n sessions wait for a lock, or fails the test
// if done yields first: what was meant to wait did not.
func awaitWaiters(t *testing.T, s *Store, n int, done <-chan error, what string) {
	t.Helper()
	for lockWaiters(t, s) < n {
		select {
		case err := <-done:
			t.Fatalf("%s did not wait: it returned %v", what, err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func unlimitedToken(t *testing.T, s *Store, id string) {
	t.Helper()
	if err := s.InsertToken(t.Context(), store.Token{ID: id, JoinMethod: store.JoinMethodToken, Ciphertext: []byte("c"),
		Nonce: []byte("n"), CreatedBy: "admin", CreatedAt: time.Now()}, benchLink); err != nil {
		t.Fatal(err)
	}
}

// TestUnlimitedTokenUseTakesNoRowLock: a join on a token of unlimited
// uses commits while another join's use of the token is not yet
// committed. The UPDATE of the token's use count made it wait for that
// commit (its row lock), so joins on one token took turns.
func TestUnlimitedTokenUseTakesNoRowLock(t *testing.T) {
	ctx := t.Context()
	s, _ := openFresh(t)
	unlimitedToken(t, s, "t1")
	held := holdTokenUse(t, s, "t1")
	done := make(chan error, 1)
	go func() {
		_, err := s.CommitJoin(ctx, joinOf(1, "t1"))
		done <- err
	}()
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("CommitJoin: %v", err)
			}
		case <-time.After(5 * time.Millisecond):
			if lockWaiters(t, s) > 0 {
				t.Fatal("the join waits for a lock held by another join's uncommitted use of the token")
			}
			continue
		}
		break
	}
	if err := held.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	tok, err := s.GetToken(ctx, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if tok.UsesCount != 2 || tok.LastUsedAt.IsZero() {
		t.Errorf("GetToken: %d uses, the last at %v; want 2 and a time", tok.UsesCount, tok.LastUsedAt)
	}
}

// TestTokenDeletionWaitsForJoinsInFlight: the deletion of a token of
// unlimited uses waits for the join using it that is in flight, and a
// join that comes after the deletion began waits for it (rather than
// keeping it waiting) and is refused: no join commits after the deletion.
func TestTokenDeletionWaitsForJoinsInFlight(t *testing.T) {
	ctx := t.Context()
	s, _ := openFresh(t)
	unlimitedToken(t, s, "t1")
	held := holdTokenUse(t, s, "t1")
	deleted, joined := make(chan error, 1), make(chan error, 1)
	go func() { deleted <- s.DeleteToken(ctx, "t1", benchLink) }()
	awaitWaiters(t, s, 1, deleted, "the deletion")
	go func() {
		_, err := s.CommitJoin(ctx, joinOf(2, "t1"))
		joined <- err
	}()
	awaitWaiters(t, s, 2, joined, "the join after the deletion")
	if err := held.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-deleted; err != nil {
		t.Fatalf("DeleteToken: %v", err)
	}
	if err := <-joined; !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the join after the deletion: %v, want ErrNotFound", err)
	}
	var uses int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM token_uses`).Scan(&uses); err != nil {
		t.Fatal(err)
	}
	if uses != 0 {
		t.Errorf("%d uses of the deleted token kept", uses)
	}
}
