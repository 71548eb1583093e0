package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/muster-dev/muster/internal/store"
)

// How a Store appends to the audit chain without holding the chain's lock
// over a round trip.
//
// A record's hash is keyed with the chain key, which lives in the
// authority and never reaches the database (docs/threat-model.md, "Authority
// → its store"), so the record can only be built in Go, on the head it
// follows. Read under pg_advisory_xact_lock(auditLockKey), that head costs
// the lock a round trip: the lock is taken with the transaction's writes,
// the head goes back to the authority, and the record comes back with
// COMMIT. Every append of every replica waits for that round trip and the
// commit before it, so with the database 10 ms away a chain took at most
// one record per 10 ms plus a commit.
//
// But the appends of one Store follow each other in an order the Store
// can fix itself. Each append is a link: it takes an advisory lock of its
// own, its baton (batonClass, its transaction's ID modulo 2^32, unique
// among the transactions under way in the cluster, and not given again
// for 2^32 transactions), in the batch that carries its writes, and holds it to its end. The links are placed in
// order as those batches come back; a link builds its record on the
// newest record of the links placed before it and not ended (which it
// waits for in Go, if they have not built theirs yet) and sends, in one
// batch, the wait for their batons, a savepoint, the chain's lock, the
// record's insert — which inserts it only if the chain's head is the
// record it was built on, and fails otherwise — and COMMIT. The
// predecessors have committed (or rolled back) when their batons are
// granted, so the chain's lock is held from its grant to the commit
// inside the database, no round trip in between.
//
// A record built on a head that is not the chain's (another replica
// appended in between, or the predecessor rolled back) fails its insert:
// the link rolls back to the savepoint — its writes stay — and appends as
// before, on the head it reads under the chain's lock, and the Store's
// next links read the head too (quiet) for a while, until a run of them
// has found at the chain's head a record of this Store's. Two
// replicas appending all the time therefore append as before, each link
// reading the head; one replica, or replicas taking turns, append without
// the round trip. Every record is checked against the head under the
// chain's lock before it is inserted, as before, so the chain is whole
// whatever the guesses.
//
// Deadlocks: a link is placed, and waits for its predecessors (in Go for
// their records, in the database for their batons), only once every row
// lock of its transaction is held; its predecessors were placed before
// it, so they hold theirs too and wait only for their own predecessors
// and the chain's lock; the chain's lock is taken after the batons, and
// its holder waits for nothing; a predecessor's baton is waited for in
// share mode, so the links that waited for one do not hold it against
// each other. So the waits form a line, never a cycle.
type chain struct {
	mu   sync.Mutex
	last *link // the newest link placed; nil before the Store's first
	// live holds the links placed and not yet ended: a link placed now
	// follows them all. unplaced counts the quiet links started and not
	// yet placed (nor ended): any of them may take the chain's lock
	// before a link placed now, so such a link does not guess.
	live     map[*link]struct{}
	unplaced int
	// quietUntil: links started before it read the head (a guess missed
	// lately); quietFor is how long the last miss made it.
	quietUntil time.Time
	quietFor   time.Duration
	// own counts the quiet links in a row that found at the chain's head
	// a record this Store built: nobody else is appending.
	own int
	// published is the newest record a link of this Store built; recent
	// holds the hashes of the last recentRecords it built, oldest first
	// (a quiet link's head is compared with them: links that guessed
	// publish their records before they commit, so the head may lag
	// published).
	published store.AuditHead
	recent    []string
	built     map[string]struct{}
}

// recentRecords is how many of its own records a Store remembers.
const recentRecords = 256

// Tuning of the guesses. A miss makes the next links quiet for
// quietMin, doubling on a miss after a quiet spell up to quietMax; links
// guess again once ownToGuess quiet links in a row found a record of
// their own Store at the head.
// predWait bounds a link's wait in Go for its predecessors' records.
var predWait = time.Second

const (
	quietMin   = 100 * time.Millisecond
	quietMax   = 5 * time.Second
	ownToGuess = 4
)

func newChain() *chain {
	return &chain{live: map[*link]struct{}{}, built: map[string]struct{}{}}
}

// link is one append of this Store to the chain.
type link struct {
	c     *chain
	baton int32
	// preds are the links this one follows: every link placed before it
	// and not ended; none for a quiet link (it reads the head). base is
	// the newest record a link of this Store had built when this one was
	// placed: the guess when the links before it have all ended.
	preds []*link
	base  store.AuditHead
	// quiet: the head is read under the chain's lock with the writes;
	// head is where.
	quiet bool
	head  store.AuditHead
	// unplaced: a quiet link counted in chain.unplaced. read: a link that
	// is not quiet but reads the head all the same (quiet links were
	// under way when it was placed).
	unplaced bool
	read     bool
	// ready is closed once rec is this link's record (ok) or the link
	// has failed without building one; a record once built is the one its
	// successors build on, even if the link misses and appends another
	// (they then miss too).
	ready chan struct{}
	rec   store.AuditHead
	ok    bool
	done  bool
}

// startAudit starts this pipe's append to the chain: it queues the link's
// baton, and for a quiet link the chain's lock and head, at the end of
// the batch being built, after the transaction's writes.
func (p *pipe) startAudit() *link {
	c := p.chain
	c.mu.Lock()
	l := &link{c: c, ready: make(chan struct{})}
	l.quiet = c.last == nil || c.own < ownToGuess || time.Now().Before(c.quietUntil)
	if l.quiet {
		l.unplaced = true
		c.unplaced++
	}
	c.mu.Unlock()
	p.row(batonLockQuery, []any{batonClass}, func(row pgx.Row) error {
		if err := row.Scan(&l.baton); err != nil {
			return wrap("append audit: baton", err)
		}
		return nil
	})
	if l.quiet {
		queueAuditHead(p, &l.head)
	}
	return l
}

// commit appends the link's record, built by build, and commits the
// pipe's transaction; the batch that startAudit queued into must have
// been sent. It returns the record as stored.
func (l *link) commit(ctx context.Context, p *pipe, build func(store.AuditHead) (store.AuditRecord, error), op string) (store.AuditRecord, error) {
	defer l.end()
	l.place()
	if l.quiet {
		return l.insert(ctx, p, l.head, build, op)
	}
	// Every predecessor's record, the newest of which is the guess.
	// (The chain of links is not kept alive past its use.)
	preds := l.preds
	l.preds = nil
	batons := make([]int32, len(preds))
	guess := l.base
	built := true
	// The wait in Go is bounded: a predecessor that has not built its
	// record by then is waited for in the database only (read the head
	// after its baton), where every wait is one PostgreSQL's deadlock
	// detector sees.
	bound := time.NewTimer(predWait)
	defer bound.Stop()
	late := false
	for i, pred := range preds {
		batons[i] = pred.baton
		if late {
			built = false
			continue
		}
		select {
		case <-pred.ready:
		case <-bound.C:
			late, built = true, false
			continue
		case <-ctx.Done():
			return store.AuditRecord{}, wrap(op+": append audit", ctx.Err())
		}
		built = built && pred.ok
		if pred.ok && pred.rec.Seq > guess.Seq {
			guess = pred.rec
		}
	}
	if !built || guess.Seq == 0 || l.read {
		// A predecessor built nothing, or a quiet link not yet placed
		// may append first: read the head, after them.
		var head store.AuditHead
		queueBatons(p, batons)
		queueAuditHead(p, &head)
		if err := p.send(ctx); err != nil {
			return store.AuditRecord{}, err
		}
		return l.insert(ctx, p, head, build, op)
	}
	rec, err := store.BuildAuditRecord(guess, build)
	if err != nil {
		return store.AuditRecord{}, fmt.Errorf("postgres: append audit: %w", err)
	}
	l.publish(rec)
	queueBatons(p, batons)
	p.exec(`SAVEPOINT audit_link`, nil, wrapped("append audit: savepoint"))
	p.exec(auditLockQuery, []any{auditLockKey}, wrapped("append audit: lock"))
	p.exec(linkAuditQuery, append(auditArgs(rec), guess.Seq, guess.Hash), readLinked)
	p.exec(`RELEASE SAVEPOINT audit_link`, nil, wrapped("append audit: release"))
	err = p.commit(ctx, op)
	if !errors.Is(err, errHeadMoved) {
		if err == nil {
			l.c.hit()
		}
		return rec, err
	}
	// Another record came first: append on the chain's head, as a
	// quiet link does, the transaction's writes kept.
	// The transaction is in error until the rollback to the savepoint,
	// and pgx prepares a batch's statements before it sends them, so the
	// rollback goes alone, as a simple query.
	l.c.miss()
	if err := p.simple(ctx, `ROLLBACK TO SAVEPOINT audit_link`); err != nil {
		return store.AuditRecord{}, wrap(op+": rollback to savepoint", err)
	}
	var head store.AuditHead
	queueAuditHead(p, &head)
	if err := p.send(ctx); err != nil {
		return store.AuditRecord{}, err
	}
	return l.insert(ctx, p, head, build, op)
}

// queueBatons queues the wait for the batons of the links this one
// follows: one (the usual case) or several.
func queueBatons(p *pipe, batons []int32) {
	switch len(batons) {
	case 0:
	case 1:
		p.exec(batonWaitQuery, []any{batonClass, batons[0]}, wrapped("append audit: wait"))
	default:
		p.exec(batonsWaitQuery, []any{batonClass, batons}, wrapped("append audit: wait"))
	}
}

// readLinked reads linkAuditQuery's answer: errHeadMoved if the head was
// not the record's.
func readLinked(_ pgconn.CommandTag, err error) error {
	if err == nil {
		return nil
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == notNullViolation && pe.ColumnName == "seq" {
		return errHeadMoved
	}
	return wrap("append audit", err)
}

// place puts the link last in its Store's order of appends, once the
// batch with its baton is back. Its transaction then holds every row lock
// it takes, and so does every link placed before it, which is all it may
// wait for: a link waiting for its predecessors never waits, through them,
// for a row it holds itself. (Placed when it started, a link could wait in
// Go for a predecessor whose writes wait for the link's rows.)
func (l *link) place() {
	c := l.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if l.unplaced {
		l.unplaced = false
		c.unplaced--
	}
	if l.quiet {
		// The head a quiet link read: a record this Store built, or
		// another writer's.
		if _, ok := c.built[string(l.head.Hash)]; ok || (l.head.Seq == 0 && c.published.Seq == 0) {
			c.own++
		} else {
			c.own = 0
		}
	} else {
		l.base = c.published
		l.read = c.unplaced > 0
		for q := range c.live {
			l.preds = append(l.preds, q)
		}
	}
	c.live[l] = struct{}{}
	c.last = l
}

// insert builds the record on head, read under the chain's lock, and
// sends it with COMMIT.
func (l *link) insert(ctx context.Context, p *pipe, head store.AuditHead, build func(store.AuditHead) (store.AuditRecord, error), op string) (store.AuditRecord, error) {
	rec, err := store.BuildAuditRecord(head, build)
	if err != nil {
		return store.AuditRecord{}, fmt.Errorf("postgres: append audit: %w", err)
	}
	l.publish(rec)
	p.exec(insertAuditQuery, auditArgs(rec), wrapped("append audit"))
	return rec, p.commit(ctx, op)
}

// publish makes rec the record the link's successors build on, once.
func (l *link) publish(rec store.AuditRecord) {
	c := l.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if l.done {
		return
	}
	l.rec, l.ok, l.done = store.AuditHead{Seq: rec.Seq, Hash: rec.Hash}, true, true
	if rec.Seq > c.published.Seq {
		c.published = l.rec
	}
	c.recent = append(c.recent, string(rec.Hash))
	c.built[string(rec.Hash)] = struct{}{}
	if len(c.recent) > recentRecords {
		delete(c.built, c.recent[0])
		c.recent = c.recent[1:]
	}
	close(l.ready)
}

// end releases the link's successors if it built nothing.
func (l *link) end() {
	c := l.c
	c.mu.Lock()
	defer c.mu.Unlock()
	l.preds = nil
	delete(c.live, l)
	if l.unplaced {
		l.unplaced = false
		c.unplaced--
	}
	if !l.done {
		l.done = true
		close(l.ready)
	}
}

// miss makes the links started next quiet, for longer if the guesses
// missed again right after the last quiet spell.
func (c *chain) miss() {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if now.After(c.quietUntil) {
		c.quietFor = min(max(2*c.quietFor, quietMin), quietMax)
	}
	c.quietUntil = now.Add(c.quietFor)
	c.own = 0
}

// hit notes a guess that held: the next miss starts from the shortest
// quiet spell.
func (c *chain) hit() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.quietFor = 0
}

// errHeadMoved is a guessed record's insert finding another head.
var errHeadMoved = errors.New("postgres: append audit: the chain's head moved")

// notNullViolation is SQLSTATE 23502.
const notNullViolation = "23502"

const (
	// batonLockQuery takes the transaction's baton and answers its
	// number: the transaction's ID modulo 2^32 (as int4). Live
	// transactions' IDs are less than 2^31 apart (wraparound), so no two
	// under way share a baton, and a number is given again only 2^32
	// transactions later: a link waiting for a predecessor's baton never
	// waits for another transaction of this Store or of another replica.
	// (The backend's PID would be unique among sessions but is taken again
	// by the session's next transaction, which a successor that has not
	// yet waited would then wait for.)
	batonLockQuery = `SELECT b FROM (SELECT (pg_current_xact_id()::text::bigint % 4294967296 - 2147483648)::int4 AS b) AS x,
		LATERAL pg_advisory_xact_lock($1, x.b)`
	// batonWaitQuery waits for a baton, batonsWaitQuery for the batons $2
	// of class $1: shared, so the links waiting for one baton do not
	// then hold it against each other.
	batonWaitQuery  = `SELECT pg_advisory_xact_lock_shared($1, $2)`
	batonsWaitQuery = `SELECT pg_advisory_xact_lock_shared($1, b) FROM unnest($2::int4[]) AS b`
	// linkAuditQuery inserts the record ($1-$11) if the chain's head is
	// seq $12 with hash $13 (an empty chain for seq 0), read under the
	// chain's lock; otherwise it offers a record without a seq, which the
	// primary key refuses (not null), failing the statement.
	linkAuditQuery = `INSERT INTO audit_records (` + auditColumns + `)
		SELECT CASE WHEN COALESCE((SELECT seq = $12::bigint AND hash = $13::bytea FROM audit_records ORDER BY seq DESC LIMIT 1), $12 = 0)
			THEN $1::bigint END, $2::bigint, $3::text, $4::text, $5::text, $6::text, $7::text, $8::text, $9::text,
			$10::bytea, $11::bytea`
)
