package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// TestFullDatabaseIsUnavailable: a write that finds no room (a full disk;
// here the database's page limit, which SQLite reports the same way, as
// SQLITE_FULL) is store.ErrUnavailable, which the authority answers with
// UNAVAILABLE so agents retry, and a failed write leaves nothing behind.
func TestFullDatabaseIsUnavailable(t *testing.T) {
	s, _ := openTemp(t)
	ctx := t.Context()
	var pages int
	if err := s.w.QueryRowContext(ctx, `PRAGMA page_count`).Scan(&pages); err != nil {
		t.Fatal(err)
	}
	if _, err := s.w.ExecContext(ctx, fmt.Sprintf(`PRAGMA max_page_count = %d`, pages+2)); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	var err error
	inserted := 0
	for i := 0; i < 200 && err == nil; i++ {
		err = s.InsertOperator(ctx, store.Operator{Serial: fmt.Sprintf("%04x", i), Name: fmt.Sprintf("op%d", i),
			SPIFFEID: "spiffe://t/admin/" + strings.Repeat("x", 2000), NotBefore: now, NotAfter: now.Add(time.Hour),
			CreatedBy: "t", CreatedAt: now}, benchLink)
		if err == nil {
			inserted++
		}
	}
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("insert into a full database: %v, want store.ErrUnavailable", err)
	}
	ops, lerr := s.ListOperators(ctx)
	if lerr != nil || len(ops) != inserted {
		t.Fatalf("after the failed write: %d operators (%v), want the %d that succeeded", len(ops), lerr, inserted)
	}
}

// TestBusyDatabaseIsUnavailable: a database another process holds locked
// past the busy timeout (a sqlite3 shell in a transaction, a backup) is
// store.ErrUnavailable, retried by agents, not an internal error.
func TestBusyDatabaseIsUnavailable(t *testing.T) {
	t.Parallel() // waits out the busy timeout on its own file
	s, path := openTemp(t)
	ctx := t.Context()
	other, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	conn, err := other.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `BEGIN EXCLUSIVE`); err != nil {
		t.Fatal(err)
	}
	defer conn.ExecContext(context.Background(), `ROLLBACK`)
	now := time.Now()
	err = s.InsertOperator(ctx, store.Operator{Serial: "01", Name: "op", SPIFFEID: "spiffe://t/admin/op",
		NotBefore: now, NotAfter: now.Add(time.Hour), CreatedBy: "t", CreatedAt: now}, benchLink)
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("insert into a database locked by another process: %v, want store.ErrUnavailable", err)
	}
}
