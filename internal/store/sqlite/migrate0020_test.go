package sqlite

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/muster-dev/muster/internal/store"
)

// TestMigration0020KeepsTheStore: a store written by a binary that knew
// migrations up to 0019 opens, migrates (the audit time index goes), and
// keeps its audit chain, read by time too, and every certificate, read by
// serial, by node, and through the CRL's locks; renewals go on.
// Not parallel: it narrows the package's migrations while the old store
// is made.
func TestMigration0020KeepsTheStore(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "muster.db")
	old := openBefore(t, path, 20)
	if err := old.InsertToken(ctx, testToken("t1", 0), benchLink); err != nil {
		t.Fatal(err)
	}
	var certs []store.Certificate
	var last store.Instance
	for n := range 3 {
		j := testJoin("t1", fmt.Sprintf("node-%d", n), fmt.Sprintf("inst-%d", n))
		j.Audit = benchLink
		res, err := old.CommitJoin(ctx, j)
		if err != nil {
			t.Fatal(err)
		}
		last = res.Instance
		now := time.Now()
		if last, err = old.CommitRenewal(ctx, store.Renewal{InstanceID: last.ID, FromGeneration: 0, ChainPEM: []byte("chain 1"), Audit: benchLink,
			Certificate: store.Certificate{Serial: fmt.Sprintf("r%d", n), PublicKey: []byte("key"), NotBefore: now, NotAfter: now.Add(time.Hour), IssuedAt: now}}); err != nil {
			t.Fatal(err)
		}
		got, err := old.ListCertificates(ctx, j.NodeID)
		if err != nil || len(got) != 2 {
			t.Fatalf("old store: %d certificates of %s, %v", len(got), j.NodeID, err)
		}
		certs = append(certs, got...)
	}
	now := time.Now()
	for _, l := range []store.Lock{
		{ID: "l1", Kind: store.LockNode, Target: "node-0", CreatedBy: "admin", CreatedAt: now},
		{ID: "l2", Kind: store.LockInstance, Target: "inst-1", CreatedBy: "admin", CreatedAt: now},
		{ID: "l3", Kind: store.LockPublicKey, Target: fmt.Sprintf("%x", "key"), CreatedBy: "admin", CreatedAt: now},
	} {
		if err := old.InsertLock(ctx, l, benchLink); err != nil {
			t.Fatal(err)
		}
	}
	revokedBefore, err := old.ListRevokedCertificates(ctx, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	headBefore, err := old.AuditHead(ctx)
	if err != nil {
		t.Fatal(err)
	}
	closeOld(t, old)

	s, err := Open(ctx, path)
	if err != nil {
		t.Fatalf("open the old store: %v", err)
	}
	defer s.Close()
	var timeIndex int
	if err := s.r.QueryRowContext(ctx, `SELECT COUNT(*) FROM sqlite_schema WHERE name = 'audit_records_time'`).Scan(&timeIndex); err != nil || timeIndex != 0 {
		t.Fatalf("audit_records_time after 0020: %d, %v", timeIndex, err)
	}
	recs, err := s.ListAudit(ctx, store.AuditFilter{Since: now.Add(-time.Hour)})
	if err != nil || len(recs) != int(headBefore.Seq) {
		t.Fatalf("ListAudit since an hour ago: %d records, %v; want %d", len(recs), err, headBefore.Seq)
	}
	for _, c := range certs {
		got, err := s.GetCertificate(ctx, c.Serial)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(c, got); diff != "" {
			t.Errorf("certificate %s after migration (-want +got):\n%s", c.Serial, diff)
		}
	}
	for n := range 3 {
		got, err := s.ListCertificates(ctx, fmt.Sprintf("node-%d", n))
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(certs[2*n:2*n+2], got); diff != "" {
			t.Errorf("node-%d's certificates after migration (-want +got):\n%s", n, diff)
		}
	}
	revoked, err := s.ListRevokedCertificates(ctx, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	less := func(a, b store.RevokedCertificate) int { return strings.Compare(a.Serial+a.Reason, b.Serial+b.Reason) }
	slices.SortFunc(revoked, less)
	slices.SortFunc(revokedBefore, less)
	if len(revoked) < 6 || !cmp.Equal(revokedBefore, revoked) {
		t.Errorf("revoked after migration %v, before %v", revoked, revokedBefore)
	}
	if head, err := s.AuditHead(ctx); err != nil || !cmp.Equal(head, headBefore) {
		t.Errorf("audit head after migration %v, %v; before %v", head, err, headBefore)
	}
	var fkProblems int
	if err := s.r.QueryRowContext(ctx, `SELECT COUNT(*) FROM pragma_foreign_key_check`).Scan(&fkProblems); err != nil || fkProblems != 0 {
		t.Fatalf("foreign key check: %d, %v", fkProblems, err)
	}
	// The migrated store takes renewals, and refuses a serial twice.
	r := store.Renewal{InstanceID: last.ID, FromGeneration: 1, ChainPEM: []byte("chain 2"), Audit: benchLink,
		Certificate: store.Certificate{Serial: "r-new", PublicKey: []byte("key 2"), NotBefore: now, NotAfter: now.Add(time.Hour), IssuedAt: now}}
	if _, err := s.CommitRenewal(ctx, r); err != nil {
		t.Fatal(err)
	}
	r.FromGeneration, r.Certificate.Serial = 2, "r0"
	if _, err := s.CommitRenewal(ctx, r); err == nil {
		t.Fatal("a renewal reusing serial r0 was recorded")
	}
}

// openBefore opens a new store at path migrated only up to the migration
// before version, as a binary that did not know it would have left it.
// Not for parallel tests: it narrows the package's migrations meanwhile.
func openBefore(t *testing.T, path string, version int) *SQLite {
	t.Helper()
	i := slices.IndexFunc(migrations, func(m store.Migration) bool { return m.Version == version })
	if i < 0 {
		t.Fatalf("no migration %04d", version)
	}
	all := migrations
	migrations = all[:i]
	old, err := Open(t.Context(), path)
	migrations = all
	if err != nil {
		t.Fatal(err)
	}
	// This binary's joins and renewals write the columns 0024 adds: the
	// old store has them while the test writes it, and loses them in
	// closeOld, so that it is migrated as the old binary left it.
	if version <= 24 {
		for _, c := range laterInstanceColumns {
			if _, err := old.w.ExecContext(t.Context(), `ALTER TABLE instances ADD COLUMN `+c+` INTEGER`); err != nil {
				t.Fatal(err)
			}
		}
	}
	return old
}

// laterInstanceColumns are the instances columns of migration 0024.
var laterInstanceColumns = []string{"last_not_after", "last_expiring_at"}

// closeOld closes a store openBefore opened, without the columns it
// added.
func closeOld(t *testing.T, old *SQLite) {
	t.Helper()
	for _, c := range laterInstanceColumns {
		if _, err := old.w.ExecContext(t.Context(), `ALTER TABLE instances DROP COLUMN `+c); err != nil {
			t.Fatal(err)
		}
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
}
