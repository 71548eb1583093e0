package postgres

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
)

// statementLog records the text of each statement the store runs, alone
// or in a batch.
type statementLog struct {
	mu  sync.Mutex
	sql []string
}

func (l *statementLog) add(sql string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sql = append(l.sql, sql)
}

func (l *statementLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	sql := l.sql
	l.sql = nil
	return sql
}

func (l *statementLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.add(d.SQL)
	return ctx
}
func (l *statementLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (l *statementLog) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (l *statementLog) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	l.add(d.SQL)
}
func (l *statementLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TestReadJoinDecoyHasTheKnownTokensShape: a join's read of an unknown
// token ID runs the one statement a known ID's runs, and it answers a
// row of the same shape (each column's type, the secret's lengths), so
// its time does not tell whether the ID exists. A bound-keypair token's
// read is the same one statement.
func TestReadJoinDecoyHasTheKnownTokensShape(t *testing.T) {
	ctx := t.Context()
	log := &statementLog{}
	s, err := Open(ctx, srv.NewDatabase(t), WithTracer(log))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if joinLockColumn+columnCount(lockColumns) != joinColumns {
		t.Fatalf("joinColumns is %d, the tables' columns %d", joinColumns, joinLockColumn+columnCount(lockColumns))
	}
	now := time.Now()
	// As the sealer writes a join token's secret: 32 bytes sealed, a
	// 12-byte nonce; never used, with an expiry, as a fresh token is.
	if err := s.InsertToken(ctx, store.Token{ID: "tok-1", JoinMethod: store.JoinMethodToken, Ciphertext: make([]byte, 32),
		Nonce: make([]byte, 12), UsesAllowed: 1, ExpiresAt: now.Add(time.Hour), CreatedBy: "admin", CreatedAt: now}, benchLink); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertToken(ctx, store.Token{ID: "bot-1", JoinMethod: store.JoinMethodBoundKeypair, Ciphertext: make([]byte, 32),
		Nonce: make([]byte, 12), NodeID: "node-b", CreatedBy: "admin", CreatedAt: now,
		BoundKeypair: &store.BoundKeypair{Spec: store.BoundKeypairSpec{RecoveryLimit: 1, RecoveryMode: store.RecoveryStandard}}}, benchLink); err != nil {
		t.Fatal(err)
	}
	targets := []store.LockTarget{{Kind: store.LockNode, Target: "node-1"}, {Kind: store.LockToken, Target: "tok-1"},
		{Kind: store.LockPublicKey, Target: "ab12"}}
	log.take()
	var ran []string
	for i, id := range []string{"tok-1", "nosuch", "bot-1"} {
		r, err := s.ReadJoin(ctx, id, "node-1", targets)
		if err != nil {
			t.Fatal(err)
		}
		if r.TokenFound != (id != "nosuch") || r.NodeFound || r.Locked || (id == "bot-1") != (r.Token.BoundKeypair != nil) {
			t.Fatalf("ReadJoin %s = %+v", id, r)
		}
		got := log.take()
		if i == 0 {
			if len(got) != 1 {
				t.Fatalf("a join's read ran %d statements, want one:\n%s", len(got), strings.Join(got, "\n---\n"))
			}
			ran = got
		} else if !slices.Equal(got, ran) {
			t.Errorf("the read of token %s ran statements other than the known token's:\n%s", id, strings.Join(got, "\n---\n"))
		}
	}

	// The row each answers, column by column, as pgx decodes it.
	shape := func(id string) (bool, []string) {
		kinds, names := lockArgs(targets)
		rows, err := s.pool.Query(ctx, ran[0], id, "node-1", kinds, names)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var (
			found bool
			types []string
			n     int
		)
		for rows.Next() {
			n++
			v, err := rows.Values()
			if err != nil {
				t.Fatal(err)
			}
			found, _ = v[0].(bool)
			for _, c := range v[1:] {
				if b, ok := c.([]byte); ok {
					types = append(types, fmt.Sprintf("[%d]byte", len(b)))
				} else {
					types = append(types, fmt.Sprintf("%T", c))
				}
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Fatalf("token %s: %d rows, want one", id, n)
		}
		return found, types
	}
	kf, known := shape("tok-1")
	df, decoy := shape("nosuch")
	if !kf || df {
		t.Errorf("found flags %v and %v, want true and false", kf, df)
	}
	if !slices.Equal(known, decoy) {
		t.Errorf("the decoy's row differs from a known token's:\n known %v\n decoy %v", known, decoy)
	}
}
