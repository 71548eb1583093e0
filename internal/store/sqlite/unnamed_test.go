package sqlite

import (
	"strings"
	"testing"
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
