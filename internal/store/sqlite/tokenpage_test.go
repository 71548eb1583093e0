package sqlite

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// TestTokenPageReadsOnlyItsBoundKeypairRows: a page of tokens that holds a
// bound-keypair token reads the bound-keypair rows of the page's tokens
// through the primary key, not every row of the table (as it did before
// the read by IDs: a whole-table SELECT for any page of more than one
// token), with or without the planner's statistics (after an ANALYZE, the
// read by "IN (SELECT value FROM json_each(?))" scanned the table again);
// and the rows read are the page's own.
func TestTokenPageReadsOnlyItsBoundKeypairRows(t *testing.T) {
	s, _ := openTemp(t)
	ctx := t.Context()
	now := time.Now().Truncate(time.Microsecond)
	const n = 300
	for i := range n {
		method, bk := store.JoinMethodToken, (*store.BoundKeypair)(nil)
		if i%3 == 0 {
			method = store.JoinMethodBoundKeypair
			bk = &store.BoundKeypair{Spec: store.BoundKeypairSpec{RecoveryLimit: int64(i), RecoveryMode: "standard"},
				SecretCiphertext: []byte("c"), SecretNonce: []byte("n")}
		}
		if err := s.InsertToken(ctx, store.Token{ID: fmt.Sprintf("tok-%03d", i), JoinMethod: method, Ciphertext: []byte{1}, Nonce: []byte{1},
			UsesAllowed: 1, Labels: map[string]string{}, CreatedBy: "t", CreatedAt: now.Add(time.Duration(i) * time.Microsecond),
			BoundKeypair: bk}, benchLink); err != nil {
			t.Fatal(err)
		}
	}
	page, err := s.ListTokensPage(ctx, store.TokenKey{}, 10)
	if err != nil {
		t.Fatal(err)
	}
	for i, tok := range page {
		bound := tok.JoinMethod == store.JoinMethodBoundKeypair
		if bound != (tok.BoundKeypair != nil) || bound && tok.BoundKeypair.Spec.RecoveryLimit != int64(i) {
			t.Errorf("%s: bound keypair %+v, want its own row", tok.ID, tok.BoundKeypair)
		}
	}

	plan := func(query string, args ...any) string {
		// On the connection that runs ANALYZE: another loads the
		// statistics only when it next reads the schema.
		rows, err := s.w.QueryContext(ctx, `EXPLAIN QUERY PLAN `+query, args...)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var steps []string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			steps = append(steps, detail)
		}
		return strings.Join(steps, "; ")
	}
	readsOnlyByKey := func(p string) bool {
		return strings.Contains(p, "SEARCH bound_keypairs USING") && !strings.Contains(p, "SCAN bound_keypairs")
	}
	for _, stats := range []string{"without statistics", "after ANALYZE"} {
		if stats == "after ANALYZE" {
			if _, err := s.w.ExecContext(ctx, `ANALYZE`); err != nil {
				t.Fatal(err)
			}
		}
		if p := plan(boundKeypairsByID, `["tok-000","tok-003","tok-006","tok-009"]`); !readsOnlyByKey(p) {
			t.Errorf("a page's bound-keypair read %s: plan %q, want a search by token ID", stats, p)
		}
	}
	// The check can fail: the read of before, the whole table.
	if p := plan(`SELECT ` + boundKeypairColumns + ` FROM bound_keypairs`); readsOnlyByKey(p) {
		t.Errorf("the whole-table read passes the check: plan %q", p)
	}
}
