package postgres

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// TestMigration0024FillsInstanceExpiry: migration 0024 fills in, from the
// certificates held, each instance's certificate expiry that joins and
// renewals before it did not record: run again on a store whose columns
// are emptied, the counts come back as a store written since counts.
func TestMigration0024FillsInstanceExpiry(t *testing.T) {
	ctx := t.Context()
	s, _ := openFresh(t)
	benchToken(t, s)
	for n := range 3 {
		j := benchJoin(int64(n))
		if n == 2 {
			j.Certificate.IssuedAt = j.Certificate.NotAfter.Add(-2 * time.Hour)
			j.Certificate.NotAfter = j.Certificate.NotAfter.Add(-2 * time.Hour)
		}
		if _, err := s.CommitJoin(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	want, err := s.CountAgentCertificates(ctx)
	if err != nil || want != (store.AgentCertificateCounts{Valid: 2, Expired: 1}) {
		t.Fatalf("CountAgentCertificates = %+v, %v; want 2 valid, 1 expired", want, err)
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
	if _, err := s.pool.Exec(ctx, `UPDATE instances SET last_not_after = NULL, last_expiring_at = NULL`); err != nil {
		t.Fatal(err)
	}
	if n, err := s.CountAgentCertificates(ctx); err != nil || n != (store.AgentCertificateCounts{}) {
		t.Fatalf("emptied: %+v, %v", n, err)
	}
	if _, err := s.pool.Exec(ctx, "UPDATE instances"+update); err != nil {
		t.Fatal(err)
	}
	if got, err := s.CountAgentCertificates(ctx); err != nil || got != want {
		t.Fatalf("after 0024's fill: %+v, %v; want %+v", got, err, want)
	}
}
