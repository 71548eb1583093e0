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

// joinTokenQuery answers with the token's row, or, when no token has the
// ID, with one decoy row of the same shape flagged 0 (a 32-byte ciphertext
// and 12-byte nonce, as the sealer writes for a join token's secret). Both
// cases then cost two index look-ups, one row and the same scan: the
// answer to a join with an unknown token ID takes as long as one with a
// known ID and a wrong secret (TestJoinTokenRefusalTiming measures it),
// so its timing does not tell whether the ID exists.
const joinTokenQuery = `SELECT 1, ` + tokenColumns + ` FROM tokens WHERE id = ?1
	UNION ALL
	SELECT 0, ?1, 'token', zeroblob(32), zeroblob(12), 1, 0, 0, '', '', '{}', '', 0, NULL, 'client'
	WHERE NOT EXISTS (SELECT 1 FROM tokens WHERE id = ?1)`

// scanJoinToken reads joinTokenQuery's row: its leading found flag, then
// the token (or the decoy).
func scanJoinToken(row scanner) (store.Token, bool, error) {
	b, err := readRow(row, 1+tokenColumnCount)
	if err != nil {
		return store.Token{}, false, err
	}
	defer b.put()
	flag := b.cols(1)
	found := flag.int() != 0
	if err := flag.done(); err != nil {
		return store.Token{}, false, err
	}
	t, err := tokenFrom(cols{v: b.raw[1 : 1+tokenColumnCount]})
	return t, found, err
}

// ReadJoin reads the token (or the decoy), the node and the lock one after
// another on the read pool: in process, a read costs no round trip, so
// the three queries a join made before cost what they cost then.
func (s *SQLite) ReadJoin(ctx context.Context, tokenID, nodeID string, targets []store.LockTarget) (store.JoinRead, error) {
	var r store.JoinRead
	if tokenID != "" {
		t, found, err := scanJoinToken(s.r.lookup(ctx, joinTokenQuery, tokenID))
		if err != nil {
			return store.JoinRead{}, wrap("read join: token "+tokenID, err)
		}
		if found {
			ts := []store.Token{t}
			if err := withBoundKeypairs(ctx, s.r, ts); err != nil {
				return store.JoinRead{}, wrap("read join: token "+tokenID, err)
			}
			r.Token, r.TokenFound = ts[0], true
		}
	}
	// No node and no lock is the usual answer for a join: it is read as
	// sql.ErrNoRows, without building the ErrNotFound error GetNode and
	// FindAnyLock would return for it.
	if nodeID != "" {
		n, err := scanNode(s.r.lookup(ctx, nodeQuery, nodeID))
		switch {
		case err == nil:
			r.Node, r.NodeFound = n, true
		case !errors.Is(err, sql.ErrNoRows):
			return store.JoinRead{}, wrap("get node "+nodeID, err)
		}
	}
	if len(targets) > 0 {
		l, err := scanLock(s.r.lookup(ctx, findAnyLockQuery(len(targets)), lockArgs(targets)...))
		switch {
		case err == nil:
			r.Lock, r.Locked = l, true
		case !errors.Is(err, sql.ErrNoRows):
			return store.JoinRead{}, wrap("find lock", err)
		}
	}
	return r, nil
}

// ReadRenewal reads the record, its instance, its node, the lock in
// force and the verifier set's ID in one statement (renewalQuery): a
// renewal's reads, and the standing check of every agent call, were five.
func (s *SQLite) ReadRenewal(ctx context.Context, serial string, keys []string) (store.RenewalRead, error) {
	args := make([]any, 0, 1+len(keys))
	args = append(args, serial)
	for _, k := range keys {
		args = append(args, k)
	}
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
	// is: the record's serial is ?1, and a joined instance's and node's
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
	certSerialColumn     = 0 // serial, the argument ?1
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

// buildRenewalQuery is the record of serial (?1) with its instance and
// node (LEFT JOIN: either may be gone, its columns then NULL), and the lock
// FindAnyLock would find over store.RenewalLockTargets: unexpired, on the
// earliest of the node, the instance, the instance's token, the record's
// key (lower-case hex, as hex.EncodeToString writes it), then each of the
// n keys (?2…), and of several on that target the oldest (ties by ID).
// A target that is empty or absent (no instance) matches nothing. The
// verifier set's ID (signer_set's one row, which migration 0005 inserts)
// ends the row. The row has the tables' columns but renewalOmitted.
func buildRenewalQuery(n int) string {
	keys := []string{`lower(hex(c.public_key))`}
	order := []string{`WHEN lk.kind = 'node' THEN 0 WHEN lk.kind = 'instance' THEN 1 WHEN lk.kind = 'token' THEN 2`,
		`WHEN lk.target = lower(hex(c.public_key)) THEN 3`}
	for i := range n {
		keys = append(keys, fmt.Sprintf("?%d", i+2))
		order = append(order, fmt.Sprintf("WHEN lk.target = ?%d THEN %d", i+2, i+4))
	}
	return `SELECT ` + prefixed("c", withoutFirst(certificateColumns, "serial")) + `,
		` + prefixed("i", withoutFirst(instanceColumns, "id")) + `,
		` + prefixed("n", withoutFirst(nodeColumns, "id")) + `,
		` + prefixed("l", lockColumns) + `,
		ss.version, ss.stepped_at
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
	WHERE c.serial = ?1`
}
