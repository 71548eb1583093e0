package sqlite

import (
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestMigration0026StampsTheCurrentSet: a store written by a binary that
// knew migrations up to 0025 opens, migrates, and its set kept at the
// current version carries the version's step time (kept for the current
// ID by that release), so it is still served; sets below it carry none.
// An insert without a step time (a replica of that release still running)
// is stamped with the store's when it is of the current version.
// Not parallel: it narrows the package's migrations while the old store
// is made.
func TestMigration0026StampsTheCurrentSet(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "muster.db")
	old := openBefore(t, path, 26)
	for _, q := range []string{
		`UPDATE signer_set SET version = 3, stepped_at = 777000 WHERE id = 1`,
		`INSERT INTO verifier_sets (version, raw) VALUES (2, 'set-2'), (3, 'set-3')`,
	} {
		if _, err := old.w.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}

	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	stamps := func() map[int64]sql.NullInt64 {
		t.Helper()
		rows, err := s.w.QueryContext(ctx, `SELECT version, stepped_at FROM verifier_sets ORDER BY version`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		m := map[int64]sql.NullInt64{}
		for rows.Next() {
			var v int64
			var at sql.NullInt64
			if err := rows.Scan(&v, &at); err != nil {
				t.Fatal(err)
			}
			m[v] = at
		}
		return m
	}
	want := map[int64]sql.NullInt64{2: {}, 3: {Int64: 777000, Valid: true}}
	if diff := cmp.Diff(want, stamps()); diff != "" {
		t.Fatalf("step times after 0026 (-want +got):\n%s", diff)
	}
	sets, err := s.VerifierSets(ctx, 0, 10)
	if err != nil || len(sets) != 2 || string(sets[1].Raw) != "set-3" {
		t.Fatalf("VerifierSets after 0026 = %+v, %v; want set-2 and set-3", sets, err)
	}
	// As the release before writes a set: no step time.
	if _, err := s.w.ExecContext(ctx, `UPDATE signer_set SET version = 4, stepped_at = 888000 WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.w.ExecContext(ctx, `INSERT INTO verifier_sets (version, raw) VALUES (4, 'set-4'), (6, 'set-6')`); err != nil {
		t.Fatal(err)
	}
	want[4], want[6] = sql.NullInt64{Int64: 888000, Valid: true}, sql.NullInt64{}
	if diff := cmp.Diff(want, stamps()); diff != "" {
		t.Fatalf("step times of sets written without one (-want +got):\n%s", diff)
	}
}
