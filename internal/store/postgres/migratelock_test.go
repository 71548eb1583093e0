package postgres

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// migratedTo returns a pool on a new database migrated to version v, and
// a connection to it that holds a transaction which has read instances
// (an ACCESS SHARE lock, as a replica's renewal or count holds one):
// migration 0025's DROP INDEX waits for it, and, while waiting, keeps the
// SHARE lock its CREATE INDEX took and queues every other request on
// instances behind its own. commit ends that transaction.
func migratedTo(t *testing.T, v int) (pool *pgxpool.Pool, url string, holder *pgx.Conn, commit func()) {
	t.Helper()
	ctx := t.Context()
	url = srv.NewDatabase(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := migrateWith(ctx, pool, migrations[:v], defaultMigrationLocks, nil); err != nil {
		t.Fatal(err)
	}
	holder, err = pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Close(context.Background()) })
	if _, err := holder.Exec(ctx, `BEGIN`); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `SELECT count(*) FROM instances`); err != nil {
		t.Fatal(err)
	}
	return pool, url, holder, func() {
		if _, err := holder.Exec(ctx, `COMMIT`); err != nil {
			t.Fatal(err)
		}
	}
}

// waitForMigrationWait waits until some session of url's database waits for a
// lock it has not been granted.
func waitForMigrationWait(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var n int
		if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
			WHERE NOT l.granted AND a.datname = current_database()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the migration never waited for a lock")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMigrationLockWaitLetsOthersThrough: migration 0025 started beside a
// replica's open transaction on instances (a rolling upgrade) waits for
// its lock at most lock_timeout at a time, so the reads and writes that
// queue behind it get through while that transaction is still open,
// instead of waiting with the migration until it ends; the migration
// tries again and is applied once the transaction ends. Before, the
// migration waited without limit and every request on instances with it.
func TestMigrationLockWaitLetsOthersThrough(t *testing.T) {
	t.Parallel()
	pool, _, _, commit := migratedTo(t, 24)
	ctx := t.Context()
	locks := migrationLocks{timeout: 200 * time.Millisecond, pause: 200 * time.Millisecond, giveUp: 10 * time.Minute}
	done := make(chan error, 1)
	go func() {
		_, err := migrateWith(ctx, pool, migrations[:25], locks, nil)
		done <- err
	}()
	waitForMigrationWait(t, pool)

	// Another replica's read and write, while the holder's transaction
	// is still open.
	for _, q := range []string{`SELECT count(*) FROM instances`, `DELETE FROM instances WHERE false`} {
		rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		_, err := pool.Exec(rctx, q)
		cancel()
		if err != nil {
			t.Fatalf("%s beside the waiting migration: %v (queued behind it)", q, err)
		}
	}
	select {
	case err := <-done:
		t.Fatalf("migration 0025 ended while a transaction still held instances: %v", err)
	default:
	}

	commit()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("migration after the holder committed: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("migration 0025 not applied two minutes after the holder committed")
	}
	var v int
	if err := pool.QueryRow(ctx, `SELECT max(version) FROM schema_migrations`).Scan(&v); err != nil || v != 25 {
		t.Fatalf("schema version %d, %v: want 25", v, err)
	}
}

// TestMigrationLockWaitGivesUpNamingTheHolder: a migration that cannot
// take its lock before giveUp fails, naming itself, the lock wait and the
// session holding it with the command that ends it, and leaves the schema
// where it was.
func TestMigrationLockWaitGivesUpNamingTheHolder(t *testing.T) {
	t.Parallel()
	pool, _, holder, _ := migratedTo(t, 24)
	ctx := t.Context()
	locks := migrationLocks{timeout: 200 * time.Millisecond, pause: 100 * time.Millisecond, giveUp: time.Second}
	_, err := migrateWith(ctx, pool, migrations[:25], locks, nil)
	if err == nil {
		t.Fatal("migration 0025 applied while a transaction held instances")
	}
	t.Logf("gave up: %v", err)
	pid := holder.PgConn().PID()
	for _, want := range []string{"migration 0025_instance_expiry_index", "lock_timeout 200ms", fmt.Sprintf("pid %d", pid),
		fmt.Sprintf("SELECT pg_terminate_backend(%d)", pid), "start the authority again"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	var v int
	if err := pool.QueryRow(ctx, `SELECT max(version) FROM schema_migrations`).Scan(&v); err != nil || v != 24 {
		t.Fatalf("schema version %d, %v: want 24", v, err)
	}
}

// TestMigrationLockWaitOmitsTheHolderQuery: the error naming the session
// that holds the lock does not repeat that session's last query, which
// may carry a secret literal (an operator's ALTER ROLE ... PASSWORD in a
// psql transaction left open): the error is printed and logged.
func TestMigrationLockWaitOmitsTheHolderQuery(t *testing.T) {
	t.Parallel()
	pool, _, holder, _ := migratedTo(t, 24)
	ctx := t.Context()
	const secret = "s3cret-literal-of-another-session"
	if _, err := holder.Exec(ctx, `SELECT '`+secret+`'`); err != nil {
		t.Fatal(err)
	}
	locks := migrationLocks{timeout: 200 * time.Millisecond, pause: 100 * time.Millisecond, giveUp: time.Second}
	_, err := migrateWith(ctx, pool, migrations[:25], locks, nil)
	if err == nil {
		t.Fatal("migration 0025 applied while a transaction held instances")
	}
	if pid := holder.PgConn().PID(); !strings.Contains(err.Error(), fmt.Sprintf("pid %d", pid)) {
		t.Errorf("error %q does not name the holder, pid %d", err, pid)
	}
	if strings.Contains(err.Error(), secret) {
		t.Errorf("error repeats the holder's last query, secret and all: %q", err)
	}
}
