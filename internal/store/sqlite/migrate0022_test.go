package sqlite

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/muster-dev/muster/internal/store"
)

// TestMigration0022KeepsTheNodes: a store written by a binary that knew
// migrations up to 0021 opens, migrates (nodes becomes WITHOUT ROWID),
// and keeps every node as it was, its foreign key to instances enforced,
// the file's integrity and its foreign keys checked clean; joins,
// renewals and node deletions go on.
// Not parallel: it narrows the package's migrations while the old store
// is made.
func TestMigration0022KeepsTheNodes(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "muster.db")
	old := openBefore(t, path, 22)
	if err := old.InsertToken(ctx, testToken("t1", 0), benchLink); err != nil {
		t.Fatal(err)
	}
	for n := range 5 {
		if _, err := old.CommitJoin(ctx, testJoin("t1", fmt.Sprintf("node-%d", n), fmt.Sprintf("inst-%d", n))); err != nil {
			t.Fatal(err)
		}
	}
	if err := old.DeleteNode(ctx, "node-4", benchLink); err != nil {
		t.Fatal(err)
	}
	before, err := old.ListNodes(ctx)
	if err != nil || len(before) != 4 {
		t.Fatalf("old store: %d nodes, %v", len(before), err)
	}
	closeOld(t, old)

	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	var ddl string
	if err := s.w.QueryRowContext(ctx, `SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = 'nodes'`).Scan(&ddl); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(ddl, "WITHOUT ROWID") || !strings.Contains(ddl, "REFERENCES instances") {
		t.Fatalf("nodes after 0022: %s", ddl)
	}
	// 0024 filled in each instance's certificate expiry from the
	// certificates held: the four nodes left, each valid for an hour.
	if n, err := s.CountAgentCertificates(ctx); err != nil || n != (store.AgentCertificateCounts{Valid: 4}) {
		t.Fatalf("CountAgentCertificates after 0024 = %+v, %v; want 4 valid", n, err)
	}
	after, err := s.ListNodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(before, after); d != "" {
		t.Fatalf("nodes changed (-before +after):\n%s", d)
	}
	for _, n := range before {
		got, err := s.GetNode(ctx, n.ID)
		if err != nil || !cmp.Equal(got, n) {
			t.Fatalf("GetNode(%s) = %+v, %v; want %+v", n.ID, got, err, n)
		}
		r, err := s.ReadRenewal(ctx, fmt.Sprintf("%x", n.InstanceID), nil)
		if err != nil || !r.NodeFound || !cmp.Equal(r.Node, n) {
			t.Fatalf("ReadRenewal of %s: node %+v found %v, %v; want %+v", n.InstanceID, r.Node, r.NodeFound, err, n)
		}
	}
	var check string
	if err := s.w.QueryRowContext(ctx, `PRAGMA integrity_check`).Scan(&check); err != nil || check != "ok" {
		t.Fatalf("integrity_check: %q, %v", check, err)
	}
	rows, err := s.w.QueryContext(ctx, `PRAGMA foreign_key_check`)
	if err != nil {
		t.Fatal(err)
	}
	if rows.Next() {
		t.Fatal("foreign_key_check found a violation")
	}
	rows.Close()
	if _, err := s.w.ExecContext(ctx, `INSERT INTO nodes (`+nodeColumns+`) VALUES ('orphan', 'token', 't1', 'no-such-instance', 0, 0)`); err == nil {
		t.Fatal("a node of an instance that does not exist was recorded")
	}

	// The store goes on: a join of the freed node ID and of a new one,
	// a duplicate refused, a deletion.
	for _, j := range []store.Join{testJoin("t1", "node-4", "inst-5"), testJoin("t1", "node-6", "inst-6")} {
		if _, err := s.CommitJoin(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.CommitJoin(ctx, testJoin("t1", "node-6", "inst-7")); err == nil {
		t.Fatal("a second join of node-6 was recorded")
	}
	if err := s.DeleteNode(ctx, "node-0", benchLink); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetNode(ctx, "node-0"); err == nil {
		t.Fatal("node-0 is still there after its deletion")
	}
}
