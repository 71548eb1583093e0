package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/muster-dev/muster/internal/store"
)

// CommitJoin performs one admission as a single READ COMMITTED transaction;
// on any error it is rolled back and nothing is written. In order:
//
//  0. The node ID's advisory lock (nodeLockQuery), so joins and deletions of
//     one ID take turns, in this process or another, and the node row read
//     next stays true until commit.
//     Then the lock check: a lock in force on any of j.LockTargets by the
//     store clock refuses the join (*store.LockedError), under the
//     targets' advisory locks taken shared (queueLockCheck), so a lock
//     committed while the join is in flight is seen or waits for it.
//  1. Retry check: if the node's current instance was created by j.TokenID
//     (or, for a join without a token, j.Credential)
//     less than j.RetryWindow ago by the store clock, is at generation 0 and
//     certified j.Certificate.PublicKey, that instance is returned with
//     Retry set and nothing is written, whatever the token's state now.
//  2. Claims: each of j.AllClaims() in order, one conditional write each
//     (claims.go). A token use takes a use only if the token is unexpired
//     and has one left by the store clock (ErrTokenSpent, or ErrNotFound if
//     there is no such token); concurrent uses of one token queue on its
//     row lock, and PostgreSQL re-evaluates the WHERE clause against the
//     row each winner committed, so no two joins can take the last use. A
//     ticket use is one INSERT … ON CONFLICT DO NOTHING on the jti
//     (ErrTicketReplayed); concurrent uses of one jti queue on the primary
//     key, and only the first to commit records it.
//  3. Node claim: ErrNodeTaken if a node holds the ID and j.MaySupersede is
//     false; otherwise its current instance becomes superseded. With
//     j.NodeFreeAtRead the node is not read: the ID is taken as free and
//     the node's INSERT checks the guess (the retry check reads the node
//     itself, so nothing before it depends on the guess); if a node holds
//     the ID, the transaction is rolled back and the join made again,
//     reading the node (errNodeTakenSinceRead).
//  5. The new instance (current, generation 0) and its certificate record;
//     ErrConflict if the instance ID or serial exists.
//  6. The join's pending report to discovery, if j.Ticket is set
//     (store.ReportOutbox).
//  7. j.Audit's record, appended to the chain (see AppendAudit).
//
// The statements travel in three round trips (pipe): BEGIN, the lock, the
// node's holder, the retry check and the claims (one statement each); then
// the writes, the chain's lock and its head; then the audit record and
// COMMIT. Checking a step's answer in Go between two of them is what the
// first and second wait for; the retry check and the claims are sent
// together, and a retry rolls back the claims it did not need. A claim
// lost to a concurrent writer is explained in one more round trip, the
// rollback with a read of its row (pipe.explain).
//
// The store fills the fields of j.Instance the contract leaves to it, and
// any of these left empty by the caller: the instance's TokenID and Last*
// fields from j and j.Certificate, and the certificate's NodeID,
// InstanceID, JoinMethod and TokenID from j and the instance. A given
// value that contradicts j is an error, not a sentinel: it is a bug in the
// caller.
func (s *Store) CommitJoin(ctx context.Context, j store.Join) (store.JoinResult, error) {
	in, cert, err := store.PrepareJoin(j)
	if err == nil {
		err = checkTicket(j.Ticket)
	}
	if err != nil {
		return store.JoinResult{}, fmt.Errorf("postgres: commit join: %w", err)
	}
	var res store.JoinResult
	write := func(j store.Join) error {
		return s.inPipe(ctx, "commit join", func(p *pipe) error {
			var err error
			res, err = commitJoin(ctx, p, j, in, cert)
			return err
		})
	}
	err = write(j)
	if errors.Is(err, errNodeTakenSinceRead) {
		// The guess was rolled back with the rest: the join is made
		// again as it is without one, reading the node.
		j.NodeFreeAtRead = false
		err = write(j)
	}
	if err != nil {
		return store.JoinResult{}, err
	}
	return res, nil
}

// errNodeTakenSinceRead is a join's answer when it took its node ID as
// free (store.Join.NodeFreeAtRead) and a node holds it: CommitJoin makes
// the join again, reading the node. It never leaves the package.
var errNodeTakenSinceRead = errors.New("postgres: commit join: the node ID was taken since the read")

// errRetry ends the first batch's reading when the retry check found the
// instance to answer with.
var errRetry = errors.New("postgres: the join is a retry")

// commitJoin is CommitJoin's work on the pipe. A retry returns without
// committing, which rolls back the claims sent with the retry check.
func commitJoin(ctx context.Context, p *pipe, j store.Join, in store.Instance, cert store.Certificate) (store.JoinResult, error) {
	// Round trip 1. held is the node's current instance, "" while the
	// node ID is free.
	p.exec(nodeLockQuery, []any{nodeLockClass, j.NodeID}, wrapped("commit join: lock node"))
	// 0. A lock in force on what the caller's read checked refuses the
	// join, a retry too (as at the read): one created since that read
	// stops it here.
	queueLockCheck(p, "commit join", store.Named(j.LockTargets))
	// A caller's read that found the node ID free is taken at its word:
	// under the node's lock nothing else changes the node until commit,
	// and the node's INSERT fails if one took the ID before the lock.
	var held string
	if !j.NodeFreeAtRead {
		p.row(`SELECT instance_id FROM nodes WHERE id = $1`, []any{j.NodeID}, func(row pgx.Row) error {
			if err := row.Scan(&held); err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return wrap("commit join", err)
			}
			return nil
		})
	}
	// 1. The retry check precedes the token use: a single-use token whose
	// reply was lost is spent, and the retry must still get its answer.
	// It precedes the ticket use too: the retry repeats the ticket the
	// first join recorded.
	var prev store.Instance
	if in.TokenID != "" && j.RetryWindow > 0 && len(cert.PublicKey) > 0 {
		p.row(`SELECT `+instanceColumns+` FROM instances
			WHERE id = (SELECT instance_id FROM nodes WHERE id = $1) AND state = 'current' AND generation = 0
			AND token_id = $2 AND last_public_key = $3 AND created_at > `+nowMicros+` - $4`,
			[]any{j.NodeID, in.TokenID, cert.PublicKey, j.RetryWindow.Microseconds()}, func(row pgx.Row) error {
				var err error
				switch prev, err = scanInstance(row); {
				case err == nil:
					return errRetry
				case !errors.Is(err, pgx.ErrNoRows):
					return wrap("commit join: retry check", err)
				}
				return nil
			})
	}
	// 2. The join's claims, each one conditional write: a claim lost to
	// a concurrent join fails this one before it has written anything
	// else. They go with the lock, in order; one whose failure needs its
	// row read again to say why is explained after the rollback.
	if err := queueClaims(p, j.NodeID, in.ID, j.AllClaims()); err != nil {
		return store.JoinResult{}, fmt.Errorf("postgres: commit join: %w", err)
	}
	switch err := p.send(ctx); {
	case errors.Is(err, errRetry):
		return store.JoinResult{Instance: prev, Retry: true}, nil
	case err != nil:
		return store.JoinResult{}, p.explain(ctx, "commit join", err)
	}

	// Round trip 2, step 3: the supersession happens before the insert: the
	// unique index instances_one_current admits one current instance per
	// node ID.
	if held != "" {
		if !j.MaySupersede {
			return store.JoinResult{}, fmt.Errorf("postgres: commit join: node %s: %w", j.NodeID, store.ErrNodeTaken)
		}
		p.exec(`UPDATE instances SET state = 'superseded' WHERE id = $1 AND state = 'current'`, []any{held},
			wrapped("commit join: supersede"))
		queueNotify(p, store.ChangeStanding, j.NodeID)
		in.PreviousID = held
	}
	nodeTaken := func(op string) func(pgconn.CommandTag, error) error {
		return func(_ pgconn.CommandTag, err error) error {
			switch {
			case err == nil:
				return nil
			case (constraintOf(err) == "instances_one_current" || constraintOf(err) == "nodes_pkey") && j.NodeFreeAtRead:
				// Taken since the caller's read: the guess is wrong, and
				// the node it did not read decides.
				return errNodeTakenSinceRead
			case constraintOf(err) == "instances_one_current", constraintOf(err) == "nodes_pkey":
				// Unreachable while every writer of the ID takes its lock;
				// kept so that a writer that does not still gets the right
				// answer.
				return fmt.Errorf("postgres: commit join: node %s: %w", j.NodeID, store.ErrNodeTaken)
			}
			return wrap(op, err)
		}
	}
	// 5. The instance goes in before the node and the certificate, which
	// refer to it.
	p.exec(`INSERT INTO instances (`+instanceColumns+`, last_not_after, last_expiring_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)`,
		append(instanceArgs(in), timeArg(cert.NotAfter), timeArg(store.ExpiringAt(cert))), nodeTaken("commit join: insert instance"))
	if held != "" {
		p.exec(`UPDATE nodes SET instance_id = $1, token_id = $2, join_method = $3, updated_at = $4 WHERE id = $5`,
			[]any{in.ID, in.TokenID, in.JoinMethod, timeArg(in.CreatedAt), j.NodeID}, nodeTaken("commit join: claim node"))
	} else {
		p.exec(`INSERT INTO nodes (`+nodeColumns+`) VALUES ($1, $2, $3, $4, $5, $6)`,
			[]any{j.NodeID, in.JoinMethod, in.TokenID, in.ID, timeArg(in.CreatedAt), timeArg(in.CreatedAt)},
			nodeTaken("commit join: claim node"))
	}
	p.exec(insertCertificateQuery, certificateArgs(cert), wrapped("commit join: insert certificate"))
	// 6. The report to discovery goes in with the join it counts, so
	// neither commits without the other.
	if j.Ticket != nil {
		p.exec(insertPendingReportQuery, pendingReportArgs(in, j.Ticket), wrapped("commit join: insert pending report"))
	}
	res := store.JoinResult{Instance: in, Superseded: in.PreviousID}
	if j.Audit == nil {
		return res, p.commit(ctx, "commit join")
	}
	// 7. Round trip 3: the audit record with COMMIT, built on the
	// record of this Store's previous append (chain.go).
	l := p.startAudit()
	defer l.end()
	if err := p.send(ctx); err != nil {
		return store.JoinResult{}, err
	}
	_, err := l.commit(ctx, p, j.Audit, "commit join")
	return res, err
}

// CommitRenewal advances an instance from r.FromGeneration to the next
// generation and records the certificate, in one transaction whose
// conditional UPDATE admits exactly one of several renewals from the same
// generation: the losers wait for the winner's row lock, then find the
// generation moved. ErrConflict, and nothing written, if the instance is
// not current or not at r.FromGeneration; ErrNotFound if there is no such
// instance. The certificate's InstanceID, NodeID, Generation, JoinMethod
// and TokenID are filled from the instance when empty; a given InstanceID,
// NodeID or Generation that contradicts it is an error.
//
// The UPDATE admits the renewal only if no lock is in force on
// r.LockTargets by the store clock (a *store.LockedError, ErrLocked, if
// one is, told after the rollback), under the targets' advisory locks
// taken shared in the statement before it (targetLocksQuery), which a
// lock's creation takes exclusive: a lock committed while the renewal is
// in flight is seen by the UPDATE, or waits for its commit.
//
// The statements travel in two round trips (pipe): BEGIN, the targets'
// advisory locks, the UPDATE, the certificate record (an INSERT … SELECT from the row the UPDATE left, so
// it inserts nothing when the UPDATE matched none), the claims (a
// refresh's key rotation, after the node's lock), the chain's lock and its
// head; then the audit record and COMMIT. A renewal refused (a lost race,
// a lost claim) costs one more: the rollback with the read that says why.
func (s *Store) CommitRenewal(ctx context.Context, r store.Renewal) (store.Instance, error) {
	c, err := store.PrepareRenewal(r)
	if err != nil {
		return store.Instance{}, fmt.Errorf("postgres: commit renewal: %w", err)
	}
	var in store.Instance
	err = s.inPipe(ctx, "commit renewal", func(p *pipe) error {
		var err error
		in, err = commitRenewal(ctx, p, r, c)
		return err
	})
	if err != nil {
		return store.Instance{}, err
	}
	return in, nil
}

// commitRenewal is CommitRenewal's work on the pipe.
func commitRenewal(ctx context.Context, p *pipe, r store.Renewal, c store.Certificate) (store.Instance, error) {
	var in store.Instance
	if len(r.Claims) > 0 {
		// A renewal's claims (a key rotation) take the bound-keypair
		// row after the instance's; a recovery takes that row and then
		// the instance's, to supersede it. Serialised first on the
		// node's lock, as every join is, the two never hold one each
		// while waiting for the other.
		p.exec(`SELECT pg_advisory_xact_lock($1, hashtext(node_id)) FROM instances WHERE id = $2`,
			[]any{nodeLockClass, r.InstanceID}, wrapped("commit renewal: lock node"))
	}
	// The targets' advisory locks, shared, before the UPDATE whose
	// snapshot then sees any lock whose creation they waited for (see
	// targetLocksQuery).
	targets := store.Named(r.LockTargets)
	kinds, names := lockArgs(targets)
	if len(targets) > 0 {
		p.exec(targetLocksQuery, []any{lockTargetClass, kinds, names}, wrapped("commit renewal: lock targets"))
	}
	// One statement: the conditional UPDATE, and the certificate record
	// inserted from the row it returns, so nothing is inserted when it
	// matched none. The fields left empty come from that row, as
	// FillRenewedCertificate fills them; it checks the given ones below.
	// A lost race is told from an unknown instance after the rollback
	// (pipe.explain), so the chain's lock taken below is not held while
	// the instance is read again.
	p.row(`WITH renewed AS (UPDATE instances
			SET generation = generation + 1, last_serial = $1, last_public_key = $2, last_chain_pem = $3, last_issued_at = $4,
				last_not_after = $11, last_expiring_at = $14
			WHERE id = $5 AND generation = $6 AND state = 'current' AND `+lockFreeCondition(12, 13)+`
			RETURNING `+instanceColumns+`),
		recorded AS (INSERT INTO certificates (`+certificateColumns+`)
			SELECT $1, COALESCE(NULLIF($7, ''), node_id), id, generation, COALESCE(NULLIF($8, ''), join_method),
				COALESCE(NULLIF($9, ''), token_id), $2, $10, $11, $4
			FROM renewed)
		SELECT id, node_id, join_method, token_id, previous_id, state, generation, created_at FROM renewed`,
		[]any{c.Serial, c.PublicKey, r.ChainPEM, timeArg(c.IssuedAt), r.InstanceID, r.FromGeneration,
			c.NodeID, c.JoinMethod, c.TokenID, timeArg(c.NotBefore), timeArg(c.NotAfter), kinds, names, timeArg(store.ExpiringAt(c))},
		func(row pgx.Row) error {
			// The four columns the UPDATE set are filled from r, not
			// sent back (the chain PEM is most of the row).
			var created *int64
			switch err := row.Scan(&in.ID, &in.NodeID, &in.JoinMethod, &in.TokenID, &in.PreviousID, &in.State,
				&in.Generation, &created); {
			case errors.Is(err, pgx.ErrNoRows):
				return notRenewed(r, kinds, names)
			case err != nil:
				return wrap("commit renewal", err)
			}
			in.CreatedAt = timeCol(created)
			in.LastSerial, in.LastPublicKey, in.LastChainPEM = c.Serial, c.PublicKey, r.ChainPEM
			if at, ok := timeArg(c.IssuedAt).(int64); ok {
				in.LastIssuedAt = timeCol(&at)
			}
			return nil
		})
	// The claims go in the same batch, after the instance's row lock:
	// a renewal that lost its race is refused for that, its claims'
	// answers unread.
	if err := queueClaims(p, "", "", r.Claims); err != nil {
		return store.Instance{}, fmt.Errorf("postgres: commit renewal: %w", err)
	}
	var l *link
	if r.Audit != nil {
		l = p.startAudit()
		defer l.end()
	}
	if err := p.send(ctx); err != nil {
		return store.Instance{}, p.explain(ctx, "commit renewal", err)
	}
	if err := store.FillRenewedCertificate(&c, in); err != nil {
		return store.Instance{}, fmt.Errorf("postgres: commit renewal: %w", err)
	}
	if l == nil {
		return in, p.commit(ctx, "commit renewal")
	}
	_, err := l.commit(ctx, p, r.Audit, "commit renewal")
	return in, err
}

// notRenewed is the refusal of a renewal whose UPDATE matched no row:
// ErrNotFound if the instance does not exist, ErrConflict if it is not
// current at r.FromGeneration, else the lock in force on the targets
// whose kinds and names are kinds and names (*store.LockedError), told
// after the rollback.
func notRenewed(r store.Renewal, kinds, names []string) *lostWrite {
	return &lostWrite{why: statement{
		sql: `SELECT (SELECT state = 'current' AND generation = $2 FROM instances WHERE id = $1), l.*
			FROM (SELECT 1) AS one LEFT JOIN LATERAL (` + findLockQuery3 + `) AS l ON true`,
		args: []any{r.InstanceID, r.FromGeneration, kinds, names},
		read: func(row pgx.Row) error {
			var (
				current          *bool
				l                store.Lock
				id, kind, target *string
				reason, by       *string
				created, expires *int64
			)
			switch err := row.Scan(&current, &id, &kind, &target, &reason, &by, &created, &expires); {
			case err != nil:
				return wrap("commit renewal", err)
			case current == nil:
				return fmt.Errorf("postgres: commit renewal: instance %s: %w", r.InstanceID, store.ErrNotFound)
			case !*current || id == nil:
				return fmt.Errorf("postgres: commit renewal: instance %s is not current at generation %d: %w",
					r.InstanceID, r.FromGeneration, store.ErrConflict)
			}
			l.ID, l.Kind, l.Target, l.Reason, l.CreatedBy = *id, *kind, *target, *reason, *by
			l.CreatedAt, l.ExpiresAt = timeCol(created), timeCol(expires)
			return fmt.Errorf("postgres: commit renewal: %w", &store.LockedError{Lock: l})
		},
	}}
}

const insertCertificateQuery = `INSERT INTO certificates (` + certificateColumns + `)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`

// instanceArgs are an instance's values in instanceColumns' order.
func instanceArgs(in store.Instance) []any {
	return []any{in.ID, in.NodeID, in.JoinMethod, in.TokenID, in.PreviousID, in.State, in.Generation,
		timeArg(in.CreatedAt), in.LastSerial, in.LastPublicKey, in.LastChainPEM, timeArg(in.LastIssuedAt)}
}

// certificateArgs are a certificate record's values in certificateColumns'
// order.
func certificateArgs(c store.Certificate) []any {
	return []any{c.Serial, c.NodeID, c.InstanceID, c.Generation, c.JoinMethod, c.TokenID, c.PublicKey,
		timeArg(c.NotBefore), timeArg(c.NotAfter), timeArg(c.IssuedAt)}
}
