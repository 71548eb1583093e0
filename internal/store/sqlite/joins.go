package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// CommitJoin performs one admission as one write of a group-committed
// transaction on the single writer (batch.go), so the token use, the node ID claim and
// the inserts are serialized against every other writer of the file, in
// this process or another; on any error nothing of it is
// written. In order:
//
//  0. Locks: a lock in force on any of j.LockTargets by the store clock
//     refuses the join (*store.LockedError), whatever else would refuse
//     it. The check is part of step 5's INSERT; a retry or a refusal
//     looks the lock up afterwards (commitJoin).
//  1. Retry check: if the node's current instance was created by j.TokenID
//     (or, for a join without a token, j.Credential)
//     less than j.RetryWindow ago by the store clock, is at generation 0 and
//     certified j.Certificate.PublicKey, that instance is returned with
//     Retry set and nothing is written, whatever the token's state now.
//  2. Claims: each of j.AllClaims() in order, one conditional write each
//     (claims.go): a token use takes a use only if the token is unexpired
//     and has one left by the store clock (ErrTokenSpent, or ErrNotFound
//     if there is no such token); a ticket use is one INSERT whose primary
//     key is the jti (ErrTicketReplayed).
//  3. Node claim: ErrNodeTaken if a node holds the ID and j.MaySupersede is
//     false; otherwise its current instance becomes superseded. With
//     j.NodeFreeAtRead the node is not read first: the ID is taken as
//     free, step 1 and this one are skipped, and the node's INSERT in
//     step 5 checks the guess; a refusal reads the node, and if one holds
//     the ID the transaction's share of the join is undone and it is made
//     again, reading the node (errNodeTakenSinceRead).
//  5. The new instance (current, generation 0) and its certificate record;
//     ErrConflict if the instance ID or serial exists.
//  6. The join's pending report to discovery, if j.Ticket is set
//     (store.ReportOutbox).
//  7. j.Audit's record, appended to the chain (see AppendAudit).
//
// The store fills the fields of j.Instance the contract leaves to it, and
// any of these left empty by the caller: the instance's TokenID and Last*
// fields from j and j.Certificate, and the certificate's NodeID,
// InstanceID, JoinMethod and TokenID from j and the instance. A given
// value that contradicts j is an error, not a sentinel: it is a bug in the
// caller.
func (s *SQLite) CommitJoin(ctx context.Context, j store.Join) (store.JoinResult, error) {
	in, cert, err := store.PrepareJoin(j)
	if err == nil {
		err = checkTicket(j.Ticket)
	}
	if err != nil {
		return store.JoinResult{}, fmt.Errorf("sqlite: commit join: %w", err)
	}

	var res store.JoinResult
	write := func(j store.Join) error {
		return s.write(ctx, func(ctx context.Context, tx *writeTx) error {
			var err error
			res, err = commitJoin(ctx, tx, j, in, cert)
			return err
		})
	}
	err = write(j)
	if errors.Is(err, errNodeTakenSinceRead) {
		// The guess wrote nothing: the join is made again as it is
		// without one, reading the node.
		j.NodeFreeAtRead = false
		err = write(j)
	}
	if err != nil {
		return store.JoinResult{}, err
	}
	if res.Instance.PreviousID != "" && !res.Retry {
		s.hub.announce(store.ChangeStanding, j.NodeID) // superseded
	}
	return res, nil
}

// commitJoin is CommitJoin's work inside the write transaction. A lock
// in force on what the caller's read checked refuses the join, a retry
// too (as at the read), whatever else would refuse it: one created since
// that read stops it here. The check costs no statement of its own on
// the way to an admission: the instance's INSERT (joinInsertQuery) adds
// its row only if no lock is in force, and a refusal or a retry, whose
// statements do not include that INSERT, looks the lock up afterwards.
func commitJoin(ctx context.Context, tx *writeTx, j store.Join, in store.Instance, cert store.Certificate) (store.JoinResult, error) {
	targets := store.Named(j.LockTargets)
	res, err := admitJoin(ctx, tx, j, in, cert, targets)
	switch {
	case err == nil && !res.Retry:
		return res, nil
	case err == nil:
		// A retry writes nothing, so nothing has checked the locks.
		if err := lockedIn(ctx, tx, "commit join", targets); err != nil {
			return store.JoinResult{}, err
		}
		return res, nil
	}
	// Any other refusal is the lock's if one is in force: the lock check
	// came first of all before it was folded into the INSERT. A failure
	// to look it up leaves the refusal as it was.
	if errors.Is(err, store.ErrLocked) {
		return store.JoinResult{}, err
	}
	if lerr := lockedIn(ctx, tx, "commit join", targets); errors.Is(lerr, store.ErrLocked) {
		return store.JoinResult{}, lerr
	}
	// A refusal under the guess that the node was free (a spent token, a
	// used ticket, the node's INSERT failing on its key) may be the
	// guess's: a node that holds the ID now could make the join a retry
	// or a supersession. Then it is made again reading the node.
	if j.NodeFreeAtRead {
		if taken, herr := exists(ctx, tx, "nodes", j.NodeID); herr == nil && taken {
			return store.JoinResult{}, errNodeTakenSinceRead
		}
	}
	return store.JoinResult{}, err
}

// errNodeTakenSinceRead is a join's answer when it took its node ID as
// free (store.Join.NodeFreeAtRead) and a node holds it: CommitJoin makes
// the join again, reading the node. It never leaves the package.
var errNodeTakenSinceRead = errors.New("sqlite: commit join: the node ID was taken since the read")

// nodeHolderQuery and retryCheckQuery are admitJoin's reads: the node's
// current instance when the join's read did not find the ID free, and
// the retry check. Their columns are unnamed and untyped (unnamed), so
// the driver makes no two strings a column.
const nodeHolderQuery = `SELECT +instance_id AS "" FROM nodes WHERE id = ?`

var retryCheckQuery = `SELECT ` + unnamed(instanceColumns) + ` FROM instances
	WHERE id = ? AND state = 'current' AND generation = 0 AND token_id = ?
	AND last_public_key = ? AND created_at > ` + nowMicros + ` - ?`

// admitJoin is commitJoin's work but for the lock check of a retry or a
// refusal.
func admitJoin(ctx context.Context, tx *writeTx, j store.Join, in store.Instance, cert store.Certificate, targets []store.LockTarget) (store.JoinResult, error) {
	var err error
	// held is the node's current instance, "" while the node ID is free.
	// A caller's read that found it free is taken at its word here and
	// checked by the node's INSERT below (commitJoin).
	var held string
	if !j.NodeFreeAtRead {
		err = tx.QueryRowContext(ctx, nodeHolderQuery, j.NodeID).Scan(&held)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return store.JoinResult{}, wrap("commit join", err)
		}
	}

	// 1. The retry check precedes the token use: a single-use token whose
	// reply was lost is spent, and the retry must still get its answer.
	// It precedes the ticket use too: the retry repeats the ticket the
	// first join recorded.
	if held != "" && in.TokenID != "" && j.RetryWindow > 0 && len(cert.PublicKey) > 0 {
		prev, err := scanInstance(tx.QueryRowContext(ctx, retryCheckQuery,
			held, in.TokenID, cert.PublicKey, j.RetryWindow.Microseconds()))
		switch {
		case err == nil:
			return store.JoinResult{Instance: prev, Retry: true}, nil // nothing was written
		case !errors.Is(err, sql.ErrNoRows):
			return store.JoinResult{}, wrap("commit join: retry check", err)
		}
	}

	// 2. The join's claims, each one conditional write: a claim lost to
	// a concurrent join fails this one before it has written anything
	// else.
	for _, c := range j.AllClaims() {
		if err := applyClaim(ctx, tx, j.NodeID, in.ID, c); err != nil {
			return store.JoinResult{}, err
		}
	}

	// 3. The supersession happens before the insert: the unique index
	// instances_one_current admits one current instance per node ID.
	if held != "" {
		if !j.MaySupersede {
			return store.JoinResult{}, fmt.Errorf("sqlite: commit join: node %s: %w", j.NodeID, store.ErrNodeTaken)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE instances SET state = 'superseded'
			WHERE id = ? AND state = 'current'`, held); err != nil {
			return store.JoinResult{}, wrap("commit join: supersede", err)
		}
		in.PreviousID = held
	}

	// 5. The instance goes in before the node and the certificate, which
	// refer to it.
	if err := insertJoinInstance(ctx, tx, j, in, cert, targets); err != nil {
		return store.JoinResult{}, err
	}
	if held != "" {
		_, err = tx.ExecContext(ctx, `UPDATE nodes
			SET instance_id = ?, token_id = ?, join_method = ?, updated_at = ?
			WHERE id = ?`,
			in.ID, in.TokenID, in.JoinMethod, timeArg(in.CreatedAt), j.NodeID)
	} else {
		created := timeArg(in.CreatedAt) // boxed once: boxing allocates
		_, err = tx.ExecContext(ctx, `INSERT INTO nodes (`+nodeColumns+`) VALUES (?, ?, ?, ?, ?, ?)`,
			j.NodeID, in.JoinMethod, in.TokenID, in.ID, created, created)
	}
	if err != nil {
		return store.JoinResult{}, wrap("commit join: claim node", err)
	}
	if err := insertCertificate(ctx, tx, cert); err != nil {
		return store.JoinResult{}, wrap("commit join: insert certificate", err)
	}
	// 6. The report to discovery goes in with the join it counts, so
	// neither is durable without the other.
	if j.Ticket != nil {
		if err := insertPendingReport(ctx, tx, in, j.Ticket); err != nil {
			return store.JoinResult{}, err
		}
	}
	if j.Audit != nil {
		if _, err := appendAudit(ctx, tx, j.Audit); err != nil {
			return store.JoinResult{}, err
		}
	}
	return store.JoinResult{Instance: in, Superseded: in.PreviousID}, nil
}

// CommitRenewal advances an instance from r.FromGeneration to the next
// generation and records the certificate, as one write of a group-committed
// transaction whose conditional UPDATE admits exactly one of several renewals from the
// same generation and no lock in force on r.LockTargets. ErrConflict, and
// nothing written, if the instance is not current or not at
// r.FromGeneration; a *store.LockedError (ErrLocked) if a lock refuses
// it; ErrNotFound if there is no such instance. A lock is inserted on the
// same single writer, so none can commit between this check and the
// write. The certificate's InstanceID, NodeID, Generation, JoinMethod and
// TokenID are filled from the instance when empty; a given InstanceID,
// NodeID or Generation that contradicts it is an error.
func (s *SQLite) CommitRenewal(ctx context.Context, r store.Renewal) (store.Instance, error) {
	c, err := store.PrepareRenewal(r)
	if err != nil {
		return store.Instance{}, fmt.Errorf("sqlite: commit renewal: %w", err)
	}

	var in store.Instance
	err = s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		var err error
		in, err = commitRenewal(ctx, tx, r, c)
		return err
	})
	if err != nil {
		return store.Instance{}, err
	}
	return in, nil
}

// commitRenewal is CommitRenewal's work inside the write transaction.
// The lock check is part of the conditional UPDATE (renewQuery), so a
// renewal that no lock refuses costs no statement more; one that matched
// no row is told apart afterwards (notRenewed).
func commitRenewal(ctx context.Context, tx *writeTx, r store.Renewal, c store.Certificate) (store.Instance, error) {
	targets := store.Named(r.LockTargets)
	var buf [20]any // on the stack (argsBuf) for up to six targets
	args := append(buf[:0], c.Serial, c.PublicKey, r.ChainPEM, timeArg(c.IssuedAt), timeArg(c.NotAfter),
		timeArg(store.ExpiringAt(c)), r.InstanceID, r.FromGeneration)
	args = appendLockArgs(args, targets)
	// The row comes back without the four columns the UPDATE set, which
	// are filled from r: the chain PEM is not copied back out of SQLite.
	// Nor does it bring the three its WHERE fixed (the id, the state, the
	// generation it set): each returned column costs the driver its name
	// and its value's allocations.
	var (
		in      store.Instance
		created nullInt
	)
	err := tx.QueryRowContext(ctx, renewQuery(len(targets)), args...).Scan(&in.NodeID, &in.JoinMethod,
		&in.TokenID, &in.PreviousID, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Instance{}, notRenewed(ctx, tx, r, targets)
	}
	if err != nil {
		return store.Instance{}, wrap("commit renewal", err)
	}
	in.ID, in.State, in.Generation = r.InstanceID, store.InstanceCurrent, r.FromGeneration+1
	in.CreatedAt = created.time()
	in.LastSerial, in.LastPublicKey, in.LastChainPEM, in.LastIssuedAt = c.Serial, c.PublicKey, r.ChainPEM, stored(c.IssuedAt)

	if err := store.FillRenewedCertificate(&c, in); err != nil {
		return store.Instance{}, fmt.Errorf("sqlite: commit renewal: %w", err)
	}
	for _, cl := range r.Claims {
		if err := applyClaim(ctx, tx, in.NodeID, "", cl); err != nil {
			return store.Instance{}, err
		}
	}
	if err := insertCertificate(ctx, tx, c); err != nil {
		return store.Instance{}, wrap("commit renewal: insert certificate", err)
	}
	if r.Audit != nil {
		if _, err := appendAudit(ctx, tx, r.Audit); err != nil {
			return store.Instance{}, err
		}
	}
	return in, nil
}

// stored is t as a time column gives it back: zero, or t's instant to the
// microsecond in UTC.
func stored(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return time.UnixMicro(t.Truncate(time.Microsecond).UnixMicro()).UTC()
}

// notRenewed says why a renewal's UPDATE matched no row: ErrNotFound
// without the instance, ErrConflict if it is not current at
// r.FromGeneration, else the lock in force on one of targets
// (*store.LockedError). Read in the write transaction, so it sees what
// the UPDATE saw.
func notRenewed(ctx context.Context, tx *writeTx, r store.Renewal, targets []store.LockTarget) error {
	var current bool
	err := tx.QueryRowContext(ctx, `SELECT state = 'current' AND generation = ? FROM instances WHERE id = ?`,
		r.FromGeneration, r.InstanceID).Scan(&current)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("sqlite: commit renewal: instance %s: %w", r.InstanceID, store.ErrNotFound)
	case err != nil:
		return wrap("commit renewal", err)
	case !current:
		return fmt.Errorf("sqlite: commit renewal: instance %s is not current at generation %d: %w",
			r.InstanceID, r.FromGeneration, store.ErrConflict)
	}
	if err := lockedIn(ctx, tx, "commit renewal", targets); err != nil {
		return err
	}
	// The lock the UPDATE saw expired since, by the store clock: a lost
	// race for the caller, which judges the renewal again.
	return fmt.Errorf("sqlite: commit renewal: instance %s was not renewed: %w", r.InstanceID, store.ErrConflict)
}

// lockedIn is a *store.LockedError naming the lock in force on targets
// (as FindAnyLock chooses it) by the store clock, read in the write
// transaction; nil if there is none.
func lockedIn(ctx context.Context, tx *writeTx, op string, targets []store.LockTarget) error {
	if len(targets) == 0 {
		return nil
	}
	l, err := scanLock(tx.QueryRowContext(ctx, findAnyLockQuery(len(targets)), lockArgs(targets)...))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil
	case err != nil:
		return wrap(op+": find lock", err)
	}
	return fmt.Errorf("sqlite: %s: %w", op, &store.LockedError{Lock: l})
}

// renewQueries[n] is the renewal's conditional UPDATE for n lock targets,
// one text per count so that each is a prepared statement the writer
// caches; a renewal has four or five, a refresh a few more.
var renewQueries = func() (qs [10]string) {
	for n := range qs {
		qs[n] = buildRenewQuery(n)
	}
	return qs
}()

func renewQuery(n int) string {
	if n < len(renewQueries) {
		return renewQueries[n]
	}
	return buildRenewQuery(n)
}

// buildRenewQuery sets the instance's latest certificate (its serial,
// public key, chain, issue time, expiry and store.ExpiringAt), advancing
// the instance (the seventh argument) from generation (the eighth) if it
// is current and no lock is in force by the store clock on any of the n
// targets that follow (kind, target pairs), each looked up through the
// (kind, target) index. Its parameters are plain ?s, in that order: the
// driver asks SQLite every parameter's name at every bind, and a
// numbered one's (?1) is a string it makes each time.
func buildRenewQuery(n int) string {
	var b strings.Builder
	b.WriteString(`UPDATE instances
		SET generation = generation + 1, last_serial = ?, last_public_key = ?, last_chain_pem = ?, last_issued_at = ?,
			last_not_after = ?, last_expiring_at = ?
		WHERE id = ? AND generation = ? AND state = 'current'`)
	if n > 0 {
		b.WriteString(` AND NOT EXISTS (SELECT 1 FROM locks WHERE (`)
		for i := range n {
			if i > 0 {
				b.WriteString(` OR `)
			}
			b.WriteString(`(kind = ? AND target = ?)`)
		}
		b.WriteString(`) AND ` + unexpired + `)`)
	}
	// Not the id, state or generation: equal to the arguments', 'current' and one more;
	// unnamed and untyped, as the request path's reads (unnamed).
	b.WriteString(` RETURNING ` + unnamed(`node_id, join_method, token_id, previous_id, created_at`))
	return b.String()
}

// insertJoinInstance inserts a join's instance if no lock is in force on
// targets: it is the join's lock check, and the lock that refuses it is
// read only then (*store.LockedError).
func insertJoinInstance(ctx context.Context, tx *writeTx, j store.Join, in store.Instance, cert store.Certificate, targets []store.LockTarget) error {
	var buf [24]any // on the stack (argsBuf) for up to five targets
	args := append(buf[:0], in.ID, in.NodeID, in.JoinMethod, in.TokenID, in.PreviousID, in.State, in.Generation,
		timeArg(in.CreatedAt), in.LastSerial, in.LastPublicKey, in.LastChainPEM, timeArg(in.LastIssuedAt),
		timeArg(cert.NotAfter), timeArg(store.ExpiringAt(cert)))
	args = appendLockArgs(args, targets)
	for try := 0; ; try++ {
		r, err := tx.ExecContext(ctx, joinInsertQuery(len(targets)), args...)
		if err != nil {
			return wrap("commit join: insert instance", err)
		}
		n, err := r.RowsAffected()
		switch {
		case err != nil:
			return wrap("commit join: insert instance", err)
		case n > 0:
			return nil
		}
		if err := lockedIn(ctx, tx, "commit join", targets); err != nil {
			return err
		}
		if try > 0 {
			// In force at each INSERT and expired at each look: the
			// store clock moves back and forth.
			return fmt.Errorf("sqlite: commit join: node %s: a lock refused it and expired since: %w", j.NodeID, store.ErrConflict)
		}
		// The lock the INSERT saw expired before it could be read, by
		// the store clock: judged now nothing refuses the join, as it
		// would not one that started now, so it is inserted now.
	}
}

// joinInsertQueries[n] is a join's INSERT of its instance for n lock
// targets, one text per count so that each is a prepared statement the
// writer caches; a join has two or three.
var joinInsertQueries = func() (qs [6]string) {
	for n := range qs {
		qs[n] = buildJoinInsertQuery(n)
	}
	return qs
}()

func joinInsertQuery(n int) string {
	if n < len(joinInsertQueries) {
		return joinInsertQueries[n]
	}
	return buildJoinInsertQuery(n)
}

// buildJoinInsertQuery inserts the instance (instanceColumns, then its
// certificate's expiry and store.ExpiringAt) if no lock is in force by
// the store clock on any of the n targets that follow (kind, target
// pairs), each looked up through the (kind, target) index. The SELECT
// reads locks, not instances, so SQLite inserts its row directly, without
// the temporary table an INSERT … SELECT from its own table takes.
func buildJoinInsertQuery(n int) string {
	var b strings.Builder
	b.WriteString(`INSERT INTO instances (` + instanceColumns + `, last_not_after, last_expiring_at)
		SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?`)
	if n > 0 {
		b.WriteString(` WHERE NOT EXISTS (SELECT 1 FROM locks WHERE (`)
		for i := range n {
			if i > 0 {
				b.WriteString(` OR `)
			}
			b.WriteString(`(kind = ? AND target = ?)`)
		}
		b.WriteString(`) AND ` + unexpired + `)`)
	}
	return b.String()
}

func insertCertificate(ctx context.Context, tx *writeTx, c store.Certificate) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO certificates (`+certificateColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		c.Serial, c.NodeID, c.InstanceID, c.Generation, c.JoinMethod, c.TokenID, c.PublicKey,
		timeArg(c.NotBefore), timeArg(c.NotAfter), timeArg(c.IssuedAt))
	return err
}

// exists reports whether table has a row with the given id. table is
// always a constant of this package.
func exists(ctx context.Context, tx *writeTx, table, id string) (bool, error) {
	var one int
	err := tx.QueryRowContext(ctx, `SELECT 1 FROM `+table+` WHERE id = ?`, id).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}
