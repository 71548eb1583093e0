package sqlite

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// TestReadJoinDecoyHasTheKnownTokensShape: a join's read of an unknown
// token ID runs the statement a known ID's runs, once, and it answers a
// row of the same shape (each column's type, the secret's lengths) with
// the same look-ups, so its time does not tell whether the ID exists. A
// bound-keypair token's read is the same one statement.
func TestReadJoinDecoyHasTheKnownTokensShape(t *testing.T) {
	s, _ := openTemp(t)
	ctx := t.Context()
	now := time.Now()
	// As the sealer writes a join token's secret: 32 bytes sealed, a
	// 12-byte nonce; never used, with an expiry, as a fresh token is.
	if err := s.InsertToken(ctx, store.Token{ID: "tok-1", JoinMethod: store.JoinMethodToken, Ciphertext: make([]byte, 32),
		Nonce: make([]byte, 12), UsesAllowed: 1, ExpiresAt: now.Add(time.Hour), CreatedBy: "admin", CreatedAt: now}, benchLink); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertToken(ctx, store.Token{ID: "bot-1", JoinMethod: store.JoinMethodBoundKeypair, Ciphertext: make([]byte, 32),
		Nonce: make([]byte, 12), NodeID: "node-b", CreatedBy: "admin", CreatedAt: now,
		BoundKeypair: &store.BoundKeypair{Spec: store.BoundKeypairSpec{RecoveryLimit: 1, RecoveryMode: store.RecoveryStandard}}}, benchLink); err != nil {
		t.Fatal(err)
	}
	targets := []store.LockTarget{{Kind: store.LockNode, Target: "node-1"}, {Kind: store.LockToken, Target: "tok-1"},
		{Kind: store.LockPublicKey, Target: "ab12"}}

	// The statements the read pool ran (its cache holds each text once):
	// a read that ran a statement no other read ran adds one.
	cached := func() []string {
		s.r.cache.mu.Lock()
		defer s.r.cache.mu.Unlock()
		var qs []string
		for q := range s.r.cache.m {
			qs = append(qs, q)
		}
		slices.Sort(qs)
		return qs
	}
	before := cached()
	var ran []string
	for i, id := range []string{"tok-1", "nosuch", "bot-1"} {
		r, err := s.ReadJoin(ctx, id, "node-1", targets)
		if err != nil {
			t.Fatal(err)
		}
		if r.TokenFound != (id != "nosuch") || r.NodeFound || r.Locked {
			t.Fatalf("ReadJoin %s = %+v", id, r)
		}
		now := cached()
		added := slices.DeleteFunc(slices.Clone(now), func(q string) bool { return slices.Contains(before, q) })
		if i == 0 {
			if len(added) != 1 {
				t.Fatalf("a join's read ran %d statements, want one:\n%s", len(added), strings.Join(added, "\n---\n"))
			}
			ran = added
		} else if len(added) != 1 || added[0] != ran[0] {
			t.Errorf("the read of token %s ran statements other than the known token's:\n%s", id, strings.Join(added, "\n---\n"))
		}
	}

	// The row each answers, column by column, as the driver gives it.
	row := func(id string) []any {
		args := joinReadArgs(nil, joinShapeOf(true, true, true), id, "node-1", targets)
		rows, err := s.r.QueryContext(ctx, ran[0], args...)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		// Unnamed and untyped (unnamed): the driver would make two
		// strings a column for each read otherwise.
		types, err := rows.ColumnTypes()
		if err != nil {
			t.Fatal(err)
		}
		for i, ct := range types {
			if ct.Name() != "" || ct.DatabaseTypeName() != "" {
				t.Errorf("column %d named %q, declared %q: want neither", i, ct.Name(), ct.DatabaseTypeName())
			}
		}
		var out [][]any
		for rows.Next() {
			cs, _ := rows.Columns()
			raw := make([]any, len(cs))
			dst := make([]any, len(cs))
			for i := range raw {
				dst[i] = &raw[i]
			}
			if err := rows.Scan(dst...); err != nil {
				t.Fatal(err)
			}
			out = append(out, raw)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if len(out) != 1 {
			t.Fatalf("token %s: %d rows, want one", id, len(out))
		}
		return out[0]
	}
	shape := func(raw []any) []string {
		var kinds []string
		for _, v := range raw[1:] { // past the found flag
			switch v := v.(type) {
			case []byte:
				kinds = append(kinds, fmt.Sprintf("[%d]byte", len(v)))
			default:
				kinds = append(kinds, fmt.Sprintf("%T", v))
			}
		}
		return kinds
	}
	known, decoy := row("tok-1"), row("nosuch")
	if known[0] != int64(1) || decoy[0] != int64(0) {
		t.Errorf("found flags %v and %v, want 1 and 0", known[0], decoy[0])
	}
	if k, d := shape(known), shape(decoy); !slices.Equal(k, d) {
		t.Errorf("the decoy's row differs from a known token's:\n known %v\n decoy %v", k, d)
	}

	// The same look-ups, both branches: the token's ID by its key, in the
	// row's branch and the decoy's; the keypair row by its key, for
	// whichever row the token part answers; the node and the locks.
	rows, err := s.r.QueryContext(ctx, "EXPLAIN QUERY PLAN "+ran[0], joinReadArgs(nil, joinShapeOf(true, true, true), "tok-1", "node-1", targets)...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	text := strings.Join(plan, "\n")
	for _, want := range []string{
		"SEARCH tokens USING INDEX sqlite_autoindex_tokens_1 (id=?)",
		"SEARCH tokens USING COVERING INDEX sqlite_autoindex_tokens_1 (id=?)",
		"SEARCH bk USING INDEX sqlite_autoindex_bound_keypairs_1 (token_id=?) LEFT-JOIN",
		"SEARCH n USING PRIMARY KEY (id=?) LEFT-JOIN",
		"SEARCH lk USING INDEX locks_kind_target (kind=? AND target=?)",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the plan has no %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "SCAN tokens") || strings.Contains(text, "SCAN bk") || strings.Contains(text, "SCAN lk") {
		t.Errorf("the plan scans a table:\n%s", text)
	}
}

// TestRenewalReadIsUnnamed: a renewal's read selects its columns unnamed
// and untyped (unnamed), as a join's does: the driver would make two
// strings a column for each read otherwise (about 70 a renewal).
func TestRenewalReadIsUnnamed(t *testing.T) {
	s, _ := openTemp(t)
	for n := range 3 {
		var keys []string
		for i := range n {
			keys = append(keys, fmt.Sprintf("k%d", i))
		}
		rows, err := s.r.QueryContext(t.Context(), renewalQuery(n), renewalArgs(nil, "00ff", keys)...)
		if err != nil {
			t.Fatal(err)
		}
		types, err := rows.ColumnTypes()
		if err != nil {
			t.Fatal(err)
		}
		if len(types) != len(renewalSelected) {
			t.Errorf("%d keys: %d columns, want %d", n, len(types), len(renewalSelected))
		}
		for i, ct := range types {
			if ct.Name() != "" || ct.DatabaseTypeName() != "" {
				t.Errorf("%d keys: column %d named %q, declared %q: want neither", n, i, ct.Name(), ct.DatabaseTypeName())
			}
		}
		rows.Close()
	}
}

// TestRenewalWriteReturnsUnnamed: the columns a renewal's UPDATE returns
// are unnamed and untyped, as the reads' (unnamed).
func TestRenewalWriteReturnsUnnamed(t *testing.T) {
	s, _ := openTemp(t)
	ctx := t.Context()
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	for n := range 3 {
		args := []any{"serial", []byte("key"), []byte("pem"), int64(1), int64(2), int64(3), "no-such-instance", int64(1)}
		for i := range n {
			args = append(args, store.LockNode, fmt.Sprintf("node-%d", i))
		}
		rows, err := tx.QueryContext(ctx, renewQuery(n), args...)
		if err != nil {
			t.Fatal(err)
		}
		types, err := rows.ColumnTypes()
		if err != nil {
			t.Fatal(err)
		}
		if len(types) != 5 {
			t.Errorf("%d targets: %d columns returned, want 5", n, len(types))
		}
		for i, ct := range types {
			if ct.Name() != "" || ct.DatabaseTypeName() != "" {
				t.Errorf("%d targets: column %d named %q, declared %q: want neither", n, i, ct.Name(), ct.DatabaseTypeName())
			}
		}
		rows.Close()
	}
}
