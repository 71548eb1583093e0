package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/muster-dev/muster/internal/store/pgtest"
)

var (
	pgOnce sync.Once
	pg     *pgtest.Server
	pgErr  error
)

// postgres starts one PostgreSQL for the package on first use and returns
// a fresh database. It fails when the server cannot start, and skips only
// where PostgreSQL is not installed (pgtest.FailOrSkip: never in CI).
func postgres(t *testing.T) string {
	t.Helper()
	pgOnce.Do(func() { pg, pgErr = pgtest.Start() })
	pgtest.FailOrSkip(t, pgErr)
	return pg.NewDatabase(t)
}

// TestAuthorityOnPostgres: init writes the first records to an empty
// PostgreSQL database, the authority runs on it, agents join and renew,
// and the audit chain and its checkpoints verify.
func TestAuthorityOnPostgres(t *testing.T) {
	t.Parallel()
	url := postgres(t)
	dir := filepath.Join(t.TempDir(), "authority")
	out := mustRun(t, "init", "--data", dir, "--store", url)
	if !strings.Contains(out, "it opens the store authority.json records, postgres://") || !strings.Contains(out, "PGPASSWORD") {
		t.Errorf("init does not say which store the authority opens and where its password comes from:\n%s", out)
	}
	if line := mustFail(t, "init", "--data", filepath.Join(t.TempDir(), "again"), "--store", url); !strings.Contains(line, "already holds") {
		t.Errorf("a second init on the same database: %q", line)
	}
	e := &joinEnv{dir: dir, auth: startAuthority(t, dir, "--store", url)}
	// The pool's size it uses, logged at start: the default, the URL
	// setting no pool_max_conns.
	if logs := e.auth.Logs(); !strings.Contains(logs, `"msg":"store connection pool","pool_max_conns":16,"set_by":"default"`) {
		t.Errorf("the authority does not log its default pool size:\n%s", logs)
	}
	e.setup(t)
	id, _ := e.join(t, e.token(t), "pg-node")
	if _, err := e.renew(t, id, must2(newCSR(t))); err != nil {
		t.Fatalf("renewal on PostgreSQL: %v", err)
	}
	if !strings.Contains(mustRun(t, "audit", "verify", "--data", dir), "intact") {
		t.Fatal("audit verify on PostgreSQL")
	}
	// The newest schema is the number of migrations, which the dialects
	// share; counted so that a new migration needs no edit here.
	migrations, err := filepath.Glob(filepath.Join("..", "internal", "store", "postgres", "migrations", "*.sql"))
	if err != nil || len(migrations) == 0 {
		t.Fatalf("migrations: %v", err)
	}
	if want := fmt.Sprintf("schema %d", len(migrations)); !strings.Contains(mustRun(t, "status", "--data", dir), want) {
		t.Errorf("status does not show the PostgreSQL schema (%s)", want)
	}
}
