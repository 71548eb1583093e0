package postgres

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
)

// TestPipeRefusalKeepsPreparedStatements: a read that refuses a good
// answer (a spent token, a lost race) ends the transaction with its
// refusal, and pgx does not take it for a failed statement: what it
// prepared for the batch stays prepared on the connection. Before, pgx
// forgot it, and the next request on that connection paid a DEALLOCATE
// and a PREPARE for each statement of the batch.
func TestPipeRefusalKeepsPreparedStatements(t *testing.T) {
	ctx := t.Context()
	// One connection, so the check below runs where the batch did.
	s, err := Open(ctx, srv.NewDatabase(t)+"&pool_max_conns=1")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const q = `SELECT $1::int + 1`
	refused := errors.New("refused")
	for range 2 { // the first prepares; the second is read from the cache
		err := s.inPipe(ctx, "test", func(p *pipe) error {
			p.row(q, []any{41}, func(row pgx.Row) error {
				var n int
				if err := row.Scan(&n); err != nil {
					return err
				}
				if n != 42 {
					t.Errorf("read %d", n)
				}
				return refused
			})
			return p.send(ctx)
		})
		if !errors.Is(err, refused) {
			t.Fatalf("inPipe = %v, want the read's refusal", err)
		}
	}
	var prepared int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM pg_prepared_statements WHERE statement = $1`, q).Scan(&prepared); err != nil {
		t.Fatal(err)
	}
	if prepared != 1 {
		t.Errorf("%d prepared statements of the refused batch on its connection, want 1 (kept)", prepared)
	}
	// A statement's own error still fails the transaction with it.
	err = s.inPipe(ctx, "test", func(p *pipe) error {
		p.row(`SELECT 1/$1::int`, []any{0}, func(row pgx.Row) error {
			var n int
			return row.Scan(&n)
		})
		return p.send(ctx)
	})
	if err == nil || errors.Is(err, refused) {
		t.Errorf("a division by zero: inPipe = %v, want its error", err)
	}
}

// TestPipeBatchErrorNamesOp: an error of a batch that no read saw (a
// statement the server could not prepare, a connection lost before the
// first answer) names the operation, as every other error of the store
// does, and keeps its mapping: a lost connection is store.ErrUnavailable,
// an error of SQL is not. Before, send returned it bare ("error
// preprocessing batch (prepare): ..."), the operation unnamed.
func TestPipeBatchErrorNamesOp(t *testing.T) {
	ctx := t.Context()
	s, err := Open(ctx, srv.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, tc := range []struct {
		name        string
		cut         bool // the pipe's connection ended before it sends
		sql         string
		unavailable bool
	}{
		{name: "not prepared", sql: `SELEC 1`},
		{name: "connection ended", cut: true, sql: `SELECT 2`, unavailable: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const op = "test batch"
			err := s.inPipe(ctx, op, func(p *pipe) error {
				if tc.cut {
					pid := p.conn.Conn().PgConn().PID()
					if _, err := s.pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
						t.Fatal(err)
					}
				}
				p.exec(tc.sql, nil, wrapped(op+": statement"))
				return p.send(ctx)
			})
			if err == nil {
				t.Fatal("inPipe succeeded")
			}
			if !strings.HasPrefix(err.Error(), "postgres: "+op+": ") {
				t.Errorf("inPipe = %q, want it prefixed %q", err, "postgres: "+op+": ")
			}
			if got := errors.Is(err, store.ErrUnavailable); got != tc.unavailable {
				t.Errorf("inPipe = %v: ErrUnavailable %v, want %v", err, got, tc.unavailable)
			}
		})
	}
}
