package sqlite

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// TestRequestPathStatementsAreUnnamed: the statements a join, a renewal's
// append or a PSK join runs besides their reads select their columns
// unnamed and untyped (unnamed): the driver would make two strings a
// column at every query otherwise.
func TestRequestPathStatementsAreUnnamed(t *testing.T) {
	s, _ := openTemp(t)
	for _, tc := range []struct {
		name  string
		query string
		args  []any
		cols  int
	}{
		{"the node's holder (admitJoin)", nodeHolderQuery, []any{"n1"}, 1},
		{"the retry check (admitJoin)", retryCheckQuery, []any{"i1", "t1", []byte{1}, int64(1)}, strings.Count(instanceColumns, ",") + 1},
		{"the audit chain's head", chainHeadQuery, nil, 3},
		{"the verifier set's ID", signerSetIDQuery, nil, 2},
		{"the PSKs (ListPSKs)", listPSKsQuery, nil, strings.Count(pskColumns, ",") + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rows, err := s.r.QueryContext(t.Context(), tc.query, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			types, err := rows.ColumnTypes()
			if err != nil {
				t.Fatal(err)
			}
			if len(types) != tc.cols {
				t.Errorf("%d columns, want %d", len(types), tc.cols)
			}
			for i, ct := range types {
				if ct.Name() != "" || ct.DatabaseTypeName() != "" {
					t.Errorf("column %d named %q, declared %q: want neither", i, ct.Name(), ct.DatabaseTypeName())
				}
			}
		})
	}
}

// TestRequestPathParametersAreUnnumbered: the statements of a join, a
// PSK join and a renewal (their reads, writes and audit appends) use
// plain ? parameters, none numbered (?1) or named (:a, @a, $a). At every
// bind the driver asks SQLite each parameter's name, and a parameter
// with one costs a Go string (an allocation) each time; a plain ? has no
// name. An argument a statement uses twice is passed twice instead.
//
// The statements are every text of the request path's builders (each
// shape of a join's read, each count of targets or keys) and whatever
// the store's two statement caches hold after joins, PSK lists and
// renewals ran through the store: a statement added to the path later is
// checked without being listed here.
func TestRequestPathParametersAreUnnumbered(t *testing.T) {
	s, _ := openTemp(t)
	ctx := t.Context()

	queries := map[string]bool{
		insertAuditQuery: true, insertAuditOnHeadQuery: true, chainHeadQuery: true,
		nodeHolderQuery: true, retryCheckQuery: true, signerSetIDQuery: true, listPSKsQuery: true,
	}
	for shape := 1; shape < joinShapes; shape++ {
		for n := range 5 {
			if (shape&joinReadsLock != 0) == (n > 0) {
				queries[joinReadQuery(shape, n)] = true
			}
		}
	}
	for n := range 6 {
		queries[renewalQuery(n)] = true
		queries[renewQuery(n)] = true
		queries[joinInsertQuery(n)] = true
		if n > 0 {
			queries[findAnyLockQuery(n)] = true
		}
	}

	// What the request path runs: two joins and two renewals, so the
	// second of each appends on the head the first left (a guessed head:
	// insertAuditOnHeadQuery), and the PSKs a PSK join lists.
	if err := s.InsertToken(ctx, store.Token{ID: "t1", JoinMethod: store.JoinMethodToken, Ciphertext: []byte("c"),
		Nonce: []byte("n"), CreatedBy: "admin", CreatedAt: time.Now()}, benchLink); err != nil {
		t.Fatal(err)
	}
	for n := range int64(2) {
		j := benchJoin(n)
		j.Audit = benchLink
		if _, err := s.ReadJoin(ctx, j.TokenID, j.NodeID, j.LockTargets); err != nil {
			t.Fatal(err)
		}
		res, err := s.CommitJoin(ctx, j)
		if err != nil {
			t.Fatal(err)
		}
		in := res.Instance
		for range 2 {
			if _, err := s.ReadRenewal(ctx, in.LastSerial, []string{"ab12"}); err != nil {
				t.Fatal(err)
			}
			if in, err = s.CommitRenewal(ctx, benchRenewal(in, n, time.Now())); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := s.ListPSKs(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SignerSetID(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*stmtCache{s.r.cache, s.wstmts} {
		c.mu.Lock()
		for q := range c.m {
			queries[q] = true
		}
		for q := range c.pending {
			queries[q] = true
		}
		c.mu.Unlock()
	}

	// Each text is run with too few arguments, one more each time: the
	// driver binds parameter i with i-1 arguments only if it has a name
	// (a ?NNN matches the argument of ordinal NNN), and says which it
	// misses otherwise. In a transaction rolled back: the last run, with
	// all its arguments (each NULL), may write.
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	params := map[string]int{} // each text's plain ?s
	for _, q := range slices.Sorted(maps.Keys(queries)) {
		var args []any
		for i := 1; ; i++ {
			_, err := tx.ExecContext(ctx, "SAVEPOINT probe")
			if err != nil {
				t.Fatal(err)
			}
			rows, err := tx.QueryContext(ctx, q, args...)
			if err == nil {
				rows.Close()
			}
			if _, rerr := tx.ExecContext(ctx, "ROLLBACK TO probe"); rerr != nil {
				t.Fatal(rerr)
			}
			if err != nil && strings.Contains(err.Error(), fmt.Sprintf("missing argument with index %d", i)) {
				args = append(args, nil) // parameter i is a plain ?
				continue
			}
			if err != nil && strings.Contains(err.Error(), "missing") {
				t.Errorf("parameter %d has a name (%v): pass the argument again to a plain ? instead, in\n%s", i, err, q)
			}
			break
		}
		params[q] = len(args)
	}
	// The probe counts what it should: a text's plain ?s.
	for q, want := range map[string]int{insertAuditQuery: 11, insertAuditOnHeadQuery: 14, renewQuery(4): 16,
		joinReadQuery(joinShapeOf(true, true, true), 3): 10, renewalQuery(1): 3} {
		if params[q] != want {
			t.Errorf("%d parameters found, want %d, in\n%s", params[q], want, q)
		}
	}
}
