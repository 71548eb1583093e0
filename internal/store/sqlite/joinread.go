package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/muster-dev/muster/internal/store"
)

// ReadJoin reads the token (or its decoy, with the token's bound-keypair
// row), the node and the lock in one statement (joinReadQuery), as
// ReadRenewal reads a renewal's: a join's read was three statements on
// the read pool (four for a bound-keypair token), each a round through
// database/sql, the driver and SQLite's VM.
func (s *SQLite) ReadJoin(ctx context.Context, tokenID, nodeID string, targets []store.LockTarget) (store.JoinRead, error) {
	shape := joinShapeOf(tokenID != "", nodeID != "", len(targets) > 0)
	if shape == 0 {
		return store.JoinRead{}, nil // nothing asked, nothing read
	}
	var buf [12]any // on the stack (argsBuf) for up to four targets
	args := joinReadArgs(buf[:0], shape, tokenID, nodeID, targets)
	row := joinRows[shape].Get().(*joinRow)
	defer row.put()
	raw := row.raw
	if err := s.r.lookup(ctx, joinReadQuery(shape, len(targets)), args...).Scan(row.dst...); err != nil {
		// Every shape answers one row: with a token, its row or the
		// decoy; without, the one row the joins hang on.
		return store.JoinRead{}, wrap("read join", err)
	}
	var r store.JoinRead
	// The columns not selected (joinOmitted), each equal to an argument:
	// the token's ID (its row's and the decoy's), a keypair row's
	// token_id is the token's, a node's ID is the node's (the joins' conditions;
	// TEXT columns compared byte for byte). A LEFT JOIN that found no row
	// leaves them NULL, as its other columns: the first, filled in only
	// for a row found, is its flag.
	raw[joinFlagColumn+1] = tokenID
	if raw[joinKeypairColumn+1] != nil { // initial_public_key, NOT NULL in the table
		raw[joinKeypairColumn] = tokenID
	}
	if raw[joinNodeColumn+1] != nil { // join_method, NOT NULL in the table
		raw[joinNodeColumn] = nodeID
	}
	at := 0
	next := func(n int) cols {
		c := cols{v: raw[at : at+n]}
		at += n
		return c
	}
	flag := next(1)
	tokenFound := flag.int() != 0
	if err := flag.done(); err != nil {
		return store.JoinRead{}, wrap("read join: token "+tokenID, err)
	}
	var err error
	tok, bk := next(tokenColumnCount), next(boundKeypairColumnCount)
	if shape&joinReadsToken != 0 {
		// The decoy is decoded too, and dropped: the same work as a
		// token's.
		t, err := tokenFrom(tok)
		if err != nil {
			return store.JoinRead{}, wrap("read join: token "+tokenID, err)
		}
		if tokenFound {
			r.Token, r.TokenFound = t, true
		}
	}
	if tokenFound {
		if found(bk) && r.Token.JoinMethod == store.JoinMethodBoundKeypair {
			if _, r.Token.BoundKeypair, err = boundKeypairFrom(bk); err != nil {
				return store.JoinRead{}, wrap("read join: token "+tokenID, err)
			}
		}
	}
	if node := next(nodeColumnCount); found(node) {
		if r.Node, err = nodeFrom(node); err != nil {
			return store.JoinRead{}, wrap("get node "+nodeID, err)
		}
		r.NodeFound = true
	}
	if l := next(lockColumnCount); found(l) {
		if r.Lock, err = lockFrom(l); err != nil {
			return store.JoinRead{}, wrap("find lock", err)
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

func joinShapeOf(token, node, lock bool) int {
	shape := 0
	if token {
		shape |= joinReadsToken
	}
	if node {
		shape |= joinReadsNode
	}
	if lock {
		shape |= joinReadsLock
	}
	return shape
}

// The columns of ReadJoin's row, whatever its shape: the token's found
// flag, the token's columns, the bound-keypair row's, the node's, the
// lock's. A shape selects the columns of what it reads but joinOmitted;
// the others stay NULL.
var (
	joinFlagColumn    = 0
	joinKeypairColumn = 1 + tokenColumnCount // the keypair row's token_id
	joinNodeColumn    = joinKeypairColumn + boundKeypairColumnCount
	joinLockColumn    = joinNodeColumn + nodeColumnCount
	joinColumns       = joinLockColumn + lockColumnCount
	joinOmitted       = []int{joinFlagColumn + 1, joinKeypairColumn, joinNodeColumn}
)

// joinSelected returns, for each column shape's query selects, its index
// in the row.
func joinSelected(shape int) (sel []int) {
	add := func(from, to int) {
		for i := from; i < to; i++ {
			if !slices.Contains(joinOmitted, i) {
				sel = append(sel, i)
			}
		}
	}
	if shape&joinReadsToken != 0 {
		add(joinFlagColumn, joinNodeColumn)
	}
	if shape&joinReadsNode != 0 {
		add(joinNodeColumn, joinLockColumn)
	}
	if shape&joinReadsLock != 0 {
		add(joinLockColumn, joinColumns)
	}
	return sel
}

// joinRow is ReadJoin's row (see renewalRow), one pool per shape: dst
// points into raw at the columns the shape's query selects.
type joinRow struct {
	raw, dst []any
	pool     *sync.Pool
}

var joinRows = func() (pools [joinShapes]*sync.Pool) {
	for shape := range pools {
		p := new(sync.Pool)
		sel := joinSelected(shape)
		p.New = func() any {
			r := &joinRow{raw: make([]any, joinColumns), dst: make([]any, len(sel)), pool: p}
			for j, i := range sel {
				r.dst[j] = &r.raw[i]
			}
			return r
		}
		pools[shape] = p
	}
	return pools
}()

func (r *joinRow) put() {
	clear(r.raw)
	r.pool.Put(r)
}

// joinReadQueries[shape][n] is ReadJoin's statement for a shape and n
// lock targets (n is 0 unless the shape reads the lock), one text each so
// that each is a prepared statement the read pool caches; a join checks
// two to four targets.
var joinReadQueries = func() (qs [joinShapes][8]string) {
	for shape := range qs {
		for n := range qs[shape] {
			if (shape&joinReadsLock != 0) == (n > 0) {
				qs[shape][n] = buildJoinReadQuery(shape, n)
			}
		}
	}
	return qs
}()

func joinReadQuery(shape, n int) string {
	if n < len(joinReadQueries[shape]) {
		return joinReadQueries[shape][n]
	}
	return buildJoinReadQuery(shape, n)
}

// joinReadArgs appends to args the arguments of joinReadQuery(shape,
// len(targets)) in the order its parameters appear: the token's ID three
// times (the row's look-up, the decoy's ID, the decoy's condition), each
// target's kind and target, then the node's ID; only those of what shape
// reads. The parameters are plain ?s, so an argument used twice is passed
// twice: the driver asks SQLite every parameter's name at every bind, and
// a numbered one's (?1) is a string it makes each time.
func joinReadArgs(args []any, shape int, tokenID, nodeID string, targets []store.LockTarget) []any {
	if shape&joinReadsToken != 0 {
		tok := any(tokenID) // boxed once: boxing a string allocates
		args = append(args, tok, tok, tok)
	}
	if shape&joinReadsLock != 0 {
		args = appendLockArgs(args, targets)
	}
	if shape&joinReadsNode != 0 {
		args = append(args, nodeID)
	}
	return args
}

// buildJoinReadQuery is, for a shape that reads the token, the token's
// row or, when no token has the ID, one decoy row of the same shape
// flagged 0 (a 32-byte ciphertext and 12-byte nonce, as the sealer writes
// for a join token's secret), then the bound-keypair row of the token the
// row names (LEFT JOIN: the decoy's ID and a join token's find none).
// Either way the statement makes the same index look-ups (the token's ID
// twice, the keypair's once) and answers one row: the answer to a join
// with an unknown token ID takes as long as one with a known ID and a
// wrong secret (TestJoinTokenRefusalTiming measures it), so its timing
// does not tell whether the ID exists. A shape without the token hangs
// its joins on one constant row. Then the node (LEFT JOIN), and the
// lock FindAnyLock would find over the n targets (a kind and a target
// each: the first by position, of several on it the oldest, ties by ID).
// Its parameters are unnumbered (joinReadArgs).
func buildJoinReadQuery(shape, n int) string {
	var with, sel []string
	from := `(SELECT 1) one`
	if shape&joinReadsToken != 0 {
		with = append(with, `tok AS (SELECT 1 AS found, `+tokenColumns+` FROM tokens WHERE id = ?
		UNION ALL
		SELECT 0, ?, 'token', zeroblob(32), zeroblob(12), 1, 0, 0, '', '', '{}', '', 0, NULL, 'client'
		WHERE NOT EXISTS (SELECT 1 FROM tokens WHERE id = ?))`)
		sel = append(sel, `tok.found, `+prefixed("tok", withoutFirst(tokenColumns, "id")),
			prefixed("bk", withoutFirst(boundKeypairColumns, "token_id")))
		from = `tok LEFT JOIN bound_keypairs bk ON bk.token_id = tok.id`
	}
	if shape&joinReadsNode != 0 {
		sel = append(sel, prefixed("n", withoutFirst(nodeColumns, "id")))
		from += `
	LEFT JOIN nodes n ON n.id = ?`
	}
	if shape&joinReadsLock != 0 {
		var values []string
		for i := range n {
			values = append(values, fmt.Sprintf("(%d, ?, ?)", i))
		}
		with = append(with, `wanted (pos, want_kind, want_target) AS (VALUES `+strings.Join(values, ", ")+`)`)
		sel = append(sel, prefixed("l", lockColumns))
		// CROSS JOIN keeps wanted the outer loop, as in FindAnyLock.
		from += `
	LEFT JOIN locks l ON l.rowid = (SELECT lk.rowid FROM wanted CROSS JOIN locks lk
		WHERE lk.kind = want_kind AND lk.target = want_target
			AND (lk.expires_at IS NULL OR lk.expires_at > ` + nowMicros + `)
		ORDER BY pos, lk.created_at, lk.id LIMIT 1)`
	}
	q := `SELECT ` + unnamed(strings.Join(sel, ", ")) + `
	FROM ` + from
	if len(with) > 0 {
		q = `WITH ` + strings.Join(with, `,
	`) + `
` + q
	}
	return q
}

// ReadRenewal reads the record, its instance, its node, the lock in
// force and the verifier set's ID in one statement (renewalQuery): a
// renewal's reads, and the standing check of every agent call, were five.
func (s *SQLite) ReadRenewal(ctx context.Context, serial string, keys []string) (store.RenewalRead, error) {
	var buf [8]any // on the stack (argsBuf) for up to three keys
	args := renewalArgs(buf[:0], serial, keys)
	var r store.RenewalRead
	row := renewalRows.Get().(*renewalRow)
	defer row.put()
	raw := row.raw
	err := s.r.lookup(ctx, renewalQuery(len(keys)), args...).Scan(row.dst...)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return store.RenewalRead{}, nil
	case err != nil:
		return store.RenewalRead{}, wrap("read renewal "+serial, err)
	}
	// The columns not selected (renewalOmitted), each equal to one that
	// is: the record's serial is the argument, and a joined instance's and node's
	// ids are the record's instance_id and node_id (the join's
	// conditions; TEXT columns compared byte for byte). A LEFT JOIN that
	// found no row leaves them NULL, as its other columns.
	raw[certSerialColumn] = serial
	if raw[instanceIDColumn+1] != nil { // node_id, NOT NULL in the table
		raw[instanceIDColumn] = raw[certInstanceIDColumn]
	}
	if raw[nodeIDColumn+1] != nil { // join_method, NOT NULL in the table
		raw[nodeIDColumn] = raw[certNodeIDColumn]
	}
	// Each table's columns in turn. A LEFT JOIN that found no row leaves
	// its columns NULL, the first (the row's id, never NULL in the
	// table) too: that is its flag.
	at := 0
	next := func(n int) cols {
		c := cols{v: raw[at : at+n]}
		at += n
		return c
	}
	if r.Certificate, err = certificateFrom(next(certificateColumnCount)); err != nil {
		return store.RenewalRead{}, wrap("read renewal "+serial, err)
	}
	r.CertificateFound = true
	if inst := next(instanceColumnCount); found(inst) {
		if r.Instance, err = instanceFrom(inst); err != nil {
			return store.RenewalRead{}, wrap("read renewal "+serial, err)
		}
		r.InstanceFound = true
	}
	if node := next(nodeColumnCount); found(node) {
		if r.Node, err = nodeFrom(node); err != nil {
			return store.RenewalRead{}, wrap("read renewal "+serial, err)
		}
		r.NodeFound = true
	}
	if l := next(lockColumnCount); found(l) {
		if r.Lock, err = lockFrom(l); err != nil {
			return store.RenewalRead{}, wrap("read renewal "+serial, err)
		}
		r.Locked = true
	}
	ss := next(2)
	r.SignerSet = store.SignerSetID{Version: ss.int(), SteppedAt: ss.int()}
	if err := ss.done(); err != nil {
		return store.RenewalRead{}, wrap("read renewal "+serial, err)
	}
	return r, nil
}

// The column counts of the tables ReadRenewal reads, and of its row.
var (
	certificateColumnCount = columnCount(certificateColumns)
	instanceColumnCount    = columnCount(instanceColumns)
	nodeColumnCount        = columnCount(nodeColumns)
	lockColumnCount        = columnCount(lockColumns)
	renewalColumns         = certificateColumnCount + instanceColumnCount + nodeColumnCount + lockColumnCount + 2
)

// The columns of ReadRenewal's row (certificateColumns, instanceColumns,
// nodeColumns, lockColumns, then the verifier set's ID) that
// renewalQuery does not select, as it would only read values ReadRenewal
// has: each column a query returns costs the driver its name (a string
// made per query) and its value (a text value is copied, then boxed).
var (
	certSerialColumn     = 0 // serial, the argument
	certNodeIDColumn     = 1
	certInstanceIDColumn = 2
	instanceIDColumn     = certificateColumnCount // the instance's id
	nodeIDColumn         = certificateColumnCount + instanceColumnCount
	renewalOmitted       = []int{certSerialColumn, instanceIDColumn, nodeIDColumn}
	// renewalSelected holds, for each column renewalQuery selects, its
	// index in the row.
	renewalSelected = func() (sel []int) {
		for i := range renewalColumns {
			if !slices.Contains(renewalOmitted, i) {
				sel = append(sel, i)
			}
		}
		return sel
	}()
)

// renewalRow is ReadRenewal's row: raw holds its columns, dst points
// into raw at the columns the query selects. Pooled: the two slices are
// about 1.2 KB a read. What ReadRenewal returns holds none of it (the
// values in raw are strings and byte slices of their own).
type renewalRow struct{ raw, dst []any }

var renewalRows = sync.Pool{New: func() any {
	r := &renewalRow{raw: make([]any, renewalColumns), dst: make([]any, len(renewalSelected))}
	for j, i := range renewalSelected {
		r.dst[j] = &r.raw[i]
	}
	return r
}}

func (r *renewalRow) put() {
	clear(r.raw)
	renewalRows.Put(r)
}

// found reports whether the columns of a LEFT JOIN's table (whose first
// is the row's id) came from a row.
func found(c cols) bool { return len(c.v) > 0 && c.v[0] != nil }

func columnCount(cols string) int { return strings.Count(cols, ",") + 1 }

// prefixed qualifies each of cols with the table alias t.
func prefixed(t, cols string) string {
	fields := strings.Split(cols, ",")
	for i, f := range fields {
		fields[i] = t + "." + strings.TrimSpace(f)
	}
	return strings.Join(fields, ", ")
}

// unnamed is a select list of column references (prefixed's) with each
// column unnamed and untyped: `+t.c AS ""`. The driver reads every
// column's name and declared type into a Go string at each query (two
// allocations a column, about 80 for a join's read of 41 columns); an
// empty name costs none, and an expression (unary + is SQLite's no-op,
// which keeps the value and its type) has no declared type. The values
// are read by position, and no column of these tables is declared DATE,
// DATETIME or TIMESTAMP, the only declared types the driver reads values
// by.
func unnamed(list string) string {
	fields := strings.Split(list, ",")
	for i, f := range fields {
		fields[i] = `+` + strings.TrimSpace(f) + ` AS ""`
	}
	return strings.Join(fields, ", ")
}

// withoutFirst is cols without its first column, which must be first.
func withoutFirst(cols, first string) string {
	rest, ok := strings.CutPrefix(cols, first+",")
	if !ok {
		panic("sqlite: " + first + " is not the first of " + cols)
	}
	return rest
}

// renewalQueries[n] is ReadRenewal's statement for n keys, one text per
// count so that each is a prepared statement the read pool caches.
var renewalQueries = func() (qs [4]string) {
	for n := range qs {
		qs[n] = buildRenewalQuery(n)
	}
	return qs
}()

func renewalQuery(n int) string {
	if n < len(renewalQueries) {
		return renewalQueries[n]
	}
	return buildRenewalQuery(n)
}

// renewalArgs appends to args the arguments of renewalQuery(len(keys)) in
// the order its parameters appear: the keys twice over (the lock's
// look-up, then its order), then the serial. Plain ?s, an argument used
// twice passed twice, as joinReadArgs.
func renewalArgs(args []any, serial string, keys []string) []any {
	from := len(args)
	for _, k := range keys {
		args = append(args, k)
	}
	// The same boxed keys again: boxing a string allocates.
	args = append(args, args[from:]...)
	return append(args, serial)
}

// buildRenewalQuery is the record of serial with its instance and
// node (LEFT JOIN: either may be gone, its columns then NULL), and the lock
// FindAnyLock would find over store.RenewalLockTargets: unexpired, on the
// earliest of the node, the instance, the instance's token, the record's
// key (lower-case hex, as hex.EncodeToString writes it), then each of the
// n keys, and of several on that target the oldest (ties by ID).
// A target that is empty or absent (no instance) matches nothing. The
// verifier set's ID (signer_set's one row, which migration 0005 inserts)
// ends the row. The row has the tables' columns but renewalOmitted, each
// unnamed and untyped (unnamed). Its parameters are unnumbered
// (renewalArgs).
func buildRenewalQuery(n int) string {
	keys := []string{`lower(hex(c.public_key))`}
	order := []string{`WHEN lk.kind = 'node' THEN 0 WHEN lk.kind = 'instance' THEN 1 WHEN lk.kind = 'token' THEN 2`,
		`WHEN lk.target = lower(hex(c.public_key)) THEN 3`}
	for i := range n {
		keys = append(keys, "?")
		order = append(order, fmt.Sprintf("WHEN lk.target = ? THEN %d", i+4))
	}
	return `SELECT ` + unnamed(prefixed("c", withoutFirst(certificateColumns, "serial"))+`, `+
		prefixed("i", withoutFirst(instanceColumns, "id"))+`, `+prefixed("n", withoutFirst(nodeColumns, "id"))+`, `+
		prefixed("l", lockColumns)+`, ss.version, ss.stepped_at`) + `
	FROM certificates c
	JOIN signer_set ss ON ss.id = 1
	LEFT JOIN instances i ON i.id = c.instance_id
	LEFT JOIN nodes n ON n.id = c.node_id
	LEFT JOIN locks l ON l.rowid = (SELECT lk.rowid FROM locks lk
		WHERE lk.target != '' AND (lk.expires_at IS NULL OR lk.expires_at > ` + nowMicros + `)
			AND ((lk.kind = 'node' AND lk.target = c.node_id)
				OR (lk.kind = 'instance' AND lk.target = i.id)
				OR (lk.kind = 'token' AND lk.target = i.token_id)
				OR (lk.kind = 'public_key' AND lk.target IN (` + strings.Join(keys, ", ") + `)))
		ORDER BY CASE ` + strings.Join(order, " ") + ` END, lk.created_at, lk.id
		LIMIT 1)
	WHERE c.serial = ?`
}
