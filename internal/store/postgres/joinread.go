package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
)

// ReadJoin reads the token (or its decoy, with the token's bound-keypair
// row), the node and the lock in one statement (joinReadQuery): a join's
// read was a batch of four, one round trip but four statements for the
// server to bind and run and the client to read.
func (s *Store) ReadJoin(ctx context.Context, tokenID, nodeID string, targets []store.LockTarget) (store.JoinRead, error) {
	shape := 0
	args := make([]any, 0, 4)
	if tokenID != "" {
		shape |= joinReadsToken
		args = append(args, tokenID)
	}
	if nodeID != "" {
		shape |= joinReadsNode
		args = append(args, nodeID)
	}
	if len(targets) > 0 {
		shape |= joinReadsLock
		kinds, names := lockArgs(targets)
		args = append(args, kinds, names)
	}
	if shape == 0 {
		return store.JoinRead{}, nil // nothing asked, nothing read
	}
	var raw [joinColumns]any
	dst := make([]any, 0, joinColumns)
	for _, part := range joinParts {
		if shape&part.shape != 0 {
			for i := part.from; i < part.to; i++ {
				dst = append(dst, &raw[i])
			}
		}
	}
	// Every shape answers one row: with a token, its row or the decoy;
	// without, the one row the joins hang on.
	if err := s.pool.QueryRow(ctx, joinReadQueries[shape], args...).Scan(dst...); err != nil {
		return store.JoinRead{}, wrap("read join", err)
	}
	var (
		r   store.JoinRead
		err error
	)
	// A LEFT JOIN that found no row leaves its columns NULL, its first
	// (the row's key, never NULL in the table) too: that is its flag.
	found, _ := raw[0].(bool)
	if shape&joinReadsToken != 0 {
		// The decoy is decoded too, and dropped: the same work as a
		// token's.
		t, err := scanToken(valuesRow(raw[1:joinKeypairColumn]))
		if err != nil {
			return store.JoinRead{}, wrap("read join: token "+tokenID, err)
		}
		if found {
			r.Token, r.TokenFound = t, true
		}
	}
	if found {
		if raw[joinKeypairColumn] != nil && r.Token.JoinMethod == store.JoinMethodBoundKeypair {
			if _, r.Token.BoundKeypair, err = scanBoundKeypair(valuesRow(raw[joinKeypairColumn:joinNodeColumn])); err != nil {
				return store.JoinRead{}, wrap("read join: token "+tokenID, err)
			}
		}
	}
	if raw[joinNodeColumn] != nil {
		if r.Node, err = scanNode(valuesRow(raw[joinNodeColumn:joinLockColumn])); err != nil {
			return store.JoinRead{}, wrap("read join: node "+nodeID, err)
		}
		r.NodeFound = true
	}
	if raw[joinLockColumn] != nil {
		if r.Lock, err = scanLock(valuesRow(raw[joinLockColumn:])); err != nil {
			return store.JoinRead{}, wrap("read join: lock", err)
		}
		r.Locked = true
	}
	return r, nil
}

// A join read's shape: which of the token, the node and the lock it asks
// for, one bit each.
const (
	joinReadsToken = 1 << iota
	joinReadsNode
	joinReadsLock
	joinShapes = 1 << iota
)

// The columns of ReadJoin's row, whatever its shape: the token's found
// flag, the token's columns, the bound-keypair row's, the node's, the
// lock's. A shape selects the columns of what it reads; the others stay
// nil.
var (
	joinKeypairColumn = 1 + columnCount(tokenColumns)
	joinNodeColumn    = joinKeypairColumn + columnCount(boundKeypairColumns)
	joinLockColumn    = joinNodeColumn + columnCount(nodeColumns)
)

const joinColumns = 1 + 14 + 15 + 6 + 7

var joinParts = []struct{ shape, from, to int }{
	{joinReadsToken, 0, joinNodeColumn},
	{joinReadsNode, joinNodeColumn, joinLockColumn},
	{joinReadsLock, joinLockColumn, joinColumns},
}

func columnCount(cols string) int { return strings.Count(cols, ",") + 1 }

// joinReadQueries[shape] is ReadJoin's statement for a shape.
var joinReadQueries = func() (qs [joinShapes]string) {
	for shape := 1; shape < joinShapes; shape++ {
		qs[shape] = buildJoinReadQuery(shape)
	}
	return qs
}()

// buildJoinReadQuery is, for a shape that reads the token, the token's
// row or, when no token has the ID, one decoy row of the same shape
// flagged false (as the SQLite store does), then the bound-keypair row of
// the token the row names (LEFT JOIN: the decoy's ID and a join token's
// find none). Either way the statement makes the same index look-ups and
// answers one row, so a join's refusal time does not tell whether the ID
// exists. A shape without the token hangs its joins on one constant row.
// Then the node (LEFT JOIN) and the lock FindAnyLock would find over the
// targets (LEFT JOIN LATERAL: findLockQuery's). The parameters are
// numbered in that order, each part's only if the shape reads it.
func buildJoinReadQuery(shape int) string {
	var sel []string
	from := `(SELECT) one`
	param := 0
	next := func() string { param++; return fmt.Sprintf("$%d", param) }
	with := ""
	if shape&joinReadsToken != 0 {
		id := next()
		with = `WITH tok AS (SELECT true AS found, ` + tokenColumns + ` FROM tokens WHERE id = ` + id + `::text
		UNION ALL
		SELECT false, ` + id + `::text, 'token', decode(repeat('00', 32), 'hex'), decode(repeat('00', 12), 'hex'), 1, 0, 0::bigint,
			'', '', '{}'::jsonb, '', 0::bigint, NULL::bigint, 'client'
		WHERE NOT EXISTS (SELECT 1 FROM tokens WHERE id = ` + id + `::text))
	`
		// labels as text: read into any, jsonb would be decoded into a map.
		sel = append(sel, strings.Replace(prefixed("tok", "found, "+tokenColumns), "tok.labels", "tok.labels::text", 1),
			prefixed("bk", boundKeypairColumns))
		from = `tok LEFT JOIN bound_keypairs bk ON bk.token_id = tok.id`
	}
	if shape&joinReadsNode != 0 {
		sel = append(sel, prefixed("n", nodeColumns))
		from += `
	LEFT JOIN nodes n ON n.id = ` + next() + `::text`
	}
	if shape&joinReadsLock != 0 {
		kinds, names := next(), next()
		sel = append(sel, prefixed("l", lockColumns))
		from += `
	LEFT JOIN LATERAL (SELECT ` + lockColumns + `
		FROM unnest(` + kinds + `::text[], ` + names + `::text[]) WITH ORDINALITY AS wanted (want_kind, want_target, pos)
		JOIN locks ON kind = want_kind AND target = want_target
		WHERE ` + unexpired + `
		ORDER BY pos, created_at, id LIMIT 1) l ON true`
	}
	return with + `SELECT ` + strings.Join(sel, `,
		`) + `
	FROM ` + from
}

// prefixed qualifies each of cols with the table alias t.
func prefixed(t, cols string) string {
	fields := strings.Split(cols, ",")
	for i, f := range fields {
		fields[i] = t + "." + strings.TrimSpace(f)
	}
	return strings.Join(fields, ", ")
}

// valuesRow is a row's values as pgx reads them into any (string,
// []byte, int64 and the other integers, bool, nil for NULL), handed to a
// scan function as the row it reads: ReadJoin reads one row of several
// tables' columns, each of which may be NULL (a LEFT JOIN's), and each
// table's scan function then takes its own.
type valuesRow []any

func (v valuesRow) Scan(dst ...any) error {
	if len(dst) != len(v) {
		return fmt.Errorf("%d columns, %d destinations", len(v), len(dst))
	}
	for i, d := range dst {
		if err := assign(d, v[i]); err != nil {
			return fmt.Errorf("column %d: %w", i, err)
		}
	}
	return nil
}

// assign stores v in dst as pgx's Scan would: a NULL only in a pointer
// or a byte slice.
func assign(dst, v any) error {
	switch d := dst.(type) {
	case *string:
		if s, ok := v.(string); ok {
			*d = s
			return nil
		}
	case *[]byte:
		switch x := v.(type) {
		case []byte:
			*d = x
			return nil
		case string:
			*d = []byte(x)
			return nil
		case nil:
			*d = nil
			return nil
		}
	case *bool:
		if b, ok := v.(bool); ok {
			*d = b
			return nil
		}
	case *int64:
		if n, ok := integer(v); ok {
			*d = n
			return nil
		}
	case **int64:
		if v == nil {
			*d = nil
			return nil
		}
		if n, ok := integer(v); ok {
			*d = &n
			return nil
		}
	}
	return fmt.Errorf("cannot store %T in %T", v, dst)
}

func integer(v any) (int64, bool) {
	switch n := v.(type) {
	case int64:
		return n, true
	case int32:
		return int64(n), true
	case int16:
		return int64(n), true
	}
	return 0, false
}

// ReadRenewal sends the record, its instance, its node, the lock query
// and the verifier set's ID as one batch: one round trip. The lock query finds its targets from the
// record and the instance itself, in store.RenewalLockTargets' order.
func (s *Store) ReadRenewal(ctx context.Context, serial string, keys []string) (store.RenewalRead, error) {
	var (
		r store.RenewalRead
		b pgx.Batch
	)
	b.Queue(`SELECT `+certificateColumns+` FROM certificates WHERE serial = $1`, serial).QueryRow(func(row pgx.Row) error {
		var err error
		r.Certificate, err = scanCertificate(row)
		r.CertificateFound = err == nil
		return noRows(err)
	})
	b.Queue(`SELECT `+instanceColumns+` FROM instances
		WHERE id = (SELECT instance_id FROM certificates WHERE serial = $1)`, serial).QueryRow(func(row pgx.Row) error {
		var err error
		r.Instance, err = scanInstance(row)
		r.InstanceFound = err == nil
		return noRows(err)
	})
	b.Queue(`SELECT `+nodeColumns+` FROM nodes
		WHERE id = (SELECT node_id FROM certificates WHERE serial = $1)`, serial).QueryRow(func(row pgx.Row) error {
		var err error
		r.Node, err = scanNode(row)
		r.NodeFound = err == nil
		return noRows(err)
	})
	kinds := []string{store.LockNode, store.LockInstance, store.LockToken, store.LockPublicKey}
	for range keys {
		kinds = append(kinds, store.LockPublicKey)
	}
	b.Queue(`WITH wanted AS (
			SELECT want_kind, want_target, pos
			FROM certificates c LEFT JOIN instances i ON i.id = c.instance_id,
				unnest($2::text[], ARRAY[c.node_id, i.id, i.token_id, encode(c.public_key, 'hex')] || $3::text[])
					WITH ORDINALITY AS w (want_kind, want_target, pos)
			WHERE c.serial = $1)
		SELECT `+lockColumns+`
		FROM wanted JOIN locks ON kind = want_kind AND target = want_target
		WHERE want_target <> '' AND `+unexpired+`
		ORDER BY pos, created_at, id LIMIT 1`, serial, kinds, keys).QueryRow(func(row pgx.Row) error {
		var err error
		r.Lock, err = scanLock(row)
		r.Locked = err == nil
		return noRows(err)
	})
	b.Queue(`SELECT version, stepped_at FROM signer_set WHERE id = 1`).QueryRow(func(row pgx.Row) error {
		return row.Scan(&r.SignerSet.Version, &r.SignerSet.SteppedAt)
	})
	if err := s.pool.SendBatch(ctx, &b).Close(); err != nil {
		return store.RenewalRead{}, wrap("read renewal", err)
	}
	if !r.CertificateFound {
		return store.RenewalRead{}, nil
	}
	return r, nil
}

// noRows is nil for pgx.ErrNoRows: an absent row is a flag of the read,
// not its failure.
func noRows(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	return err
}
