package sqlite

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/storetest"
)

// TestExpiringAtAgreesWithMigration0024: migration 0024's SQL, which
// filled in the instances before it, and store.ExpiringAt, which every
// join, renewal and bulk load since writes, agree to the microsecond at
// the boundaries of the integer division: lifetimes of 0 to 5 µs and of
// a day and 1 or 3 µs, an issue time finer than the store keeps, a
// not-after before the issue. Before, store.ExpiringAt rounded down where
// the SQL rounded up: a microsecond apart on three lifetimes in four.
func TestExpiringAtAgreesWithMigration0024(t *testing.T) {
	ctx := t.Context()
	s, _ := openTemp(t)
	if err := s.InsertToken(ctx, testToken("t1", 0), benchLink); err != nil {
		t.Fatal(err)
	}
	cases := storetest.ExpiringAtCases()
	want := map[string]int64{}
	for n, c := range cases {
		j := testJoin("t1", fmt.Sprintf("node-%d", n), fmt.Sprintf("inst-%d", n))
		j.Certificate.NotBefore, j.Certificate.IssuedAt = c.Issued.Add(-time.Minute), c.Issued
		j.Certificate.NotAfter = c.Issued.Add(c.Lifetime)
		if _, err := s.CommitJoin(ctx, j); err != nil {
			t.Fatal(err)
		}
		want[j.Instance.ID] = store.ExpiringAt(j.Certificate).UnixMicro()
	}
	i := slices.IndexFunc(migrations, func(m store.Migration) bool { return m.Version == 24 })
	if i < 0 {
		t.Fatal("no migration 0024")
	}
	_, update, ok := strings.Cut(migrations[i].SQL, "UPDATE instances")
	update, _, _ = strings.Cut(update, ";")
	if !ok {
		t.Fatalf("migration 0024 has no UPDATE:\n%s", migrations[i].SQL)
	}
	if _, err := s.w.ExecContext(ctx, `UPDATE instances SET last_not_after = NULL, last_expiring_at = NULL`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.w.ExecContext(ctx, "UPDATE instances"+update); err != nil {
		t.Fatal(err)
	}
	rows, err := s.w.QueryContext(ctx, `SELECT i.id, i.last_expiring_at, c.not_after, c.Issued_at
		FROM instances i JOIN certificates c ON c.serial = i.last_serial`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	seen := 0
	for rows.Next() {
		var id string
		var got, notAfter, issued int64
		if err := rows.Scan(&id, &got, &notAfter, &issued); err != nil {
			t.Fatal(err)
		}
		seen++
		if got != want[id] {
			t.Errorf("%s: migration 0024's last_expiring_at %d, store.ExpiringAt %d (not after %d, issued %d, %+d µs)",
				id, got, want[id], notAfter, issued, got-want[id])
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if seen != len(want) {
		t.Fatalf("%d instances, want %d", seen, len(want))
	}
}
