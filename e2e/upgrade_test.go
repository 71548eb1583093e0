package e2e

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestAuthorityUpgradeAndDowngrade walks docs/install.md's "Upgrades" for
// the SQLite store through the binary: a database a release before
// migration 0025 left (made here by taking 0025 and any later ones back by
// hand, takeBack: no older binary is built) is migrated at start, and the
// authority says so before it serves (a migration on a large fleet takes
// seconds to minutes before the listeners open), while an offline command
// of the new version refuses to migrate it under the old authority; a
// start on the current
// schema says nothing of it; and a database a newer muster migrated is
// refused, changing nothing, with a way out that works pasted (`muster
// version` prints the schema the binary knows).
func TestAuthorityUpgradeAndDowngrade(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	latest := knownSchema(t)
	takeBackSchema(t, filepath.Join(dir, "muster.db"))

	// An offline command of the new version beside the old authority
	// does not move the schema on under it.
	msg := mustFail(t, "audit", "list", "--offline", "--data", dir)
	if !strings.Contains(msg, fmt.Sprintf("the store is at schema version 24; this muster knows version %d and would migrate it", latest)) ||
		!strings.Contains(msg, "or upgrade the authority first") {
		t.Errorf("audit list --offline on the old schema: %q, want a refusal naming the way out", msg)
	}
	if v := schemaOf(t, dir); v != 24 {
		t.Fatalf("schema version %d after an offline command refused, want 24", v)
	}

	a := startAuthority(t, dir)
	a.stop(t)
	var migrating, migrated bool
	for _, line := range strings.Split(a.Logs(), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		switch rec["msg"] {
		case "store: migrating the schema; the authority serves once it is done":
			migrating = rec["from_version"] == float64(24) && rec["to_version"] == float64(latest)
		case "store: schema migrated":
			migrated = migrating && rec["took"] != nil
		case "authority started":
			if !migrated {
				t.Errorf("the authority started before it said the migration from 24 to %d began and ended (%v, %v)", latest, migrating, migrated)
			}
		}
	}
	if v := schemaOf(t, dir); v != latest {
		t.Fatalf("schema version %d after the upgrade, want %d", v, latest)
	}

	a = startAuthority(t, dir)
	a.stop(t)
	if strings.Contains(a.Logs(), "store: migrating the schema") {
		t.Errorf("a start on the current schema said it migrates:\n%s", a.Logs())
	}

	// A newer muster's migration: this binary is now the old one.
	withDB(t, dir, func(db *sql.DB) {
		mustExec(t, db, `INSERT INTO schema_migrations (version, applied_at) VALUES (?, 0)`, latest+1)
	})
	msg = mustFail(t, "authority", "--data", dir, "--listen", "127.0.0.1:0", "--metrics-listen", "")
	want := fmt.Sprintf("database is at schema version %d, this binary knows up to %d", latest+1, latest)
	if !strings.Contains(msg, want) || !strings.Contains(msg, fmt.Sprintf("run a muster that knows schema version %d or later (`muster version` shows", latest+1)) ||
		!strings.Contains(msg, "restore the database from the backup taken before the upgrade") {
		t.Errorf("authority on a newer schema: %q\nwant %q and both ways out", msg, want)
	}
	if v := schemaOf(t, dir); v != latest+1 {
		t.Errorf("schema version %d after the refusal, want it left at %d", v, latest+1)
	}
}

// takeBack undoes the SQLite migrations from 0025 on, each as it was
// released (a migration is never edited), so the test starts from the
// schema a release before 0025 left. A new migration adds its inverse
// here.
var takeBack = map[int][]string{
	28: {
		`ALTER TABLE jwt_svid_key DROP COLUMN next_salt`,
		`ALTER TABLE jwt_svid_key DROP COLUMN salt`,
		`ALTER TABLE jwt_svid_key DROP COLUMN prev_salt`,
	},
	27: {
		`ALTER TABLE agent_streams DROP COLUMN turn_count`,
		`ALTER TABLE agent_streams DROP COLUMN turn_at`,
		`ALTER TABLE agent_streams DROP COLUMN turn_to`,
		`ALTER TABLE agent_streams DROP COLUMN turn_from`,
		`ALTER TABLE agent_streams DROP COLUMN holder`,
	},
	26: {
		`DROP TRIGGER verifier_sets_stamp`,
		`ALTER TABLE verifier_sets DROP COLUMN stepped_at`,
	},
	25: {
		`CREATE INDEX instances_current_not_after ON instances (last_not_after) WHERE state = 'current'`,
		`CREATE INDEX instances_current_expiring_at ON instances (last_expiring_at) WHERE state = 'current'`,
		`DROP INDEX instances_current_expiry`,
	},
}

// takeBackSchema takes the SQLite store at path, which no process holds,
// back to schema 24 (takeBack): a store a release before 0025 left.
func takeBackSchema(t *testing.T, path string) {
	t.Helper()
	latest := knownSchema(t)
	withDBFile(t, path, func(db *sql.DB) {
		for v := latest; v >= 25; v-- {
			stmts, ok := takeBack[v]
			if !ok {
				t.Fatalf("takeBack has no statements undoing migration %04d: add them (its SQLite migration's inverse)", v)
			}
			for _, q := range stmts {
				mustExec(t, db, q)
			}
			mustExec(t, db, `DELETE FROM schema_migrations WHERE version = ?`, v)
		}
	})
}

// knownSchema is the store schema `muster version` says the binary knows.
func knownSchema(t *testing.T) int {
	t.Helper()
	m := regexp.MustCompile(`(?m)^Schema: +store (\d+), data directory \d+$`).FindStringSubmatch(mustRun(t, "version"))
	if m == nil {
		t.Fatal("muster version names no store schema")
	}
	v, _ := strconv.Atoi(m[1])
	return v
}

// schemaOf is the schema version of the store in dir.
func schemaOf(t *testing.T, dir string) (v int) {
	t.Helper()
	withDB(t, dir, func(db *sql.DB) {
		if err := db.QueryRow(`SELECT max(version) FROM schema_migrations`).Scan(&v); err != nil {
			t.Fatal(err)
		}
	})
	return v
}

// withDB opens the SQLite store in dir, which no process holds, for f.
func withDB(t *testing.T, dir string, f func(db *sql.DB)) {
	t.Helper()
	withDBFile(t, filepath.Join(dir, "muster.db"), f)
}

// withDBFile opens the SQLite store at path, which no process holds, for f.
func withDBFile(t *testing.T, path string, f func(db *sql.DB)) {
	t.Helper()
	db, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	f(db)
}

// saidMigration reports whether logs (JSON lines) say the schema is being
// migrated from 24 to latest, then that it was, as the authority's start
// says it; then is the end of the first line's message.
func saidMigration(logs string, latest int, then string) bool {
	migrating := false
	for _, line := range strings.Split(logs, "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		switch rec["msg"] {
		case "store: migrating the schema; " + then:
			migrating = rec["from_version"] == float64(24) && rec["to_version"] == float64(latest)
		case "store: schema migrated":
			return migrating && rec["took"] != nil
		}
	}
	return false
}

// TestDiscoveryAndBenchSeedSayTheyMigrate: discovery's start, its
// commands and bench seed migrate a store of an older schema saying so
// before and after, as the authority's start does (a migration on a
// large store takes minutes); before, they migrated it without a word.
func TestDiscoveryAndBenchSeedSayTheyMigrate(t *testing.T) {
	t.Parallel()
	latest := knownSchema(t)
	ddir := filepath.Join(t.TempDir(), "discovery")
	db := filepath.Join(ddir, "discovery.db")
	startDiscovery(t, ddir).stop(t)
	takeBackSchema(t, db)
	d := startDiscovery(t, ddir)
	d.stop(t)
	if !saidMigration(d.Logs(), latest, "discovery's store opens once it is done") {
		t.Errorf("discovery started on schema 24 did not say it migrates it to %d:\n%s", latest, d.Logs())
	}
	takeBackSchema(t, db)
	r := muster(t, nil, "discovery", "show", "--data", ddir, "-o", "json")
	if r.code != 0 || !saidMigration(r.stderr, latest, "discovery's store opens once it is done") {
		t.Errorf("discovery show on schema 24: exit %d, stderr %s; want it to say it migrates to %d", r.code, r.stderr, latest)
	}
	if r := muster(t, nil, "discovery", "show", "--data", ddir, "-o", "json"); strings.Contains(r.stderr, "store: ") {
		t.Errorf("discovery show on the current schema said: %s", r.stderr)
	}

	dir, _ := initDir(t)
	takeBackSchema(t, filepath.Join(dir, "muster.db"))
	r = muster(t, nil, "bench", "seed", "--data", dir, "--tokens", "1", "--nodes", "0")
	if r.code != 0 || !saidMigration(r.stderr, latest, "the seed begins once it is done") {
		t.Errorf("bench seed on schema 24: exit %d, stderr %s; want it to say it migrates to %d", r.code, r.stderr, latest)
	}
	if v := schemaOf(t, dir); v != latest {
		t.Errorf("schema %d after bench seed, want %d", v, latest)
	}
}
