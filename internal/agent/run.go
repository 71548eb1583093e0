package agent

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/errinfo"
)

// Backoff of transient failures and the longest wait for a renewal;
// variables so tests can shorten them.
var (
	backoffMin = time.Second
	backoffMax = 5 * time.Minute
	// maxSleep bounds one wait, so a machine that was suspended notices
	// on waking that a renewal is due (timers do not count suspension).
	// It is also how often the agent looks at Options.Now: a test that
	// moves that clock shortens it.
	maxSleep = time.Minute
)

// renewJitter spreads renewals of agents that joined together.
const renewJitter = 0.1

// Waits of an agent the authority refused for a lock; variables so tests
// can shorten them.
var (
	// lockedRecheck is how often an agent refused for a lock without a
	// TTL asks again, and the longest it waits for one with a TTL. Such
	// a lock ends only by muster lock delete, which the authority cannot
	// tell an agent it refuses (its stream is closed): asking again at
	// this interval brings the fleet back by itself once the operator
	// lifts the lock, instead of a restart by hand on every machine, at
	// the cost of one refused (and audited) renewal, and one refused
	// reconnection of its stream, per locked agent per interval. A lock with a long TTL may be deleted before it ends,
	// hence the bound on that wait too.
	lockedRecheck = 15 * time.Minute
	// lockedJitterMax bounds the jitter added to a wait for a lock: a
	// tenth of the wait, at least a second, at most this. It spreads
	// agents locked together, and prolongs a short lock little.
	lockedJitterMax = 30 * time.Second
)

// every says how often an interval recurs, in the words a hint uses
// ("every 15 minutes", "every hour"), so the hints say what lockedRecheck
// is rather than repeat it.
func every(d time.Duration) string {
	for _, u := range []struct {
		d    time.Duration
		name string
	}{{time.Hour, "hour"}, {time.Minute, "minute"}, {time.Second, "second"}} {
		if d >= u.d && d%u.d == 0 {
			if n := d / u.d; n > 1 {
				return fmt.Sprintf("every %d %ss", n, u.name)
			}
			return "every " + u.name
		}
	}
	return "every " + d.String()
}

// lockedWait reports whether err is the authority's refusal for a lock
// (PERMISSION_DENIED, reason locked) and how long to wait before asking
// again: until the lock ends, as the refusal says (its RetryInfo), at most
// lockedRecheck, or lockedRecheck for a lock without a TTL (and from an
// authority that does not say); never less than floor, plus jitter.
// The authority checks every lock again at the next attempt: a lock
// created meanwhile, or another one in force, refuses it again.
func lockedWait(err error, floor time.Duration) (time.Duration, bool) {
	l, ok := lockRefusalOf(err)
	if !ok {
		return 0, false
	}
	return l.wait(floor), true
}

// lockRefusal is the authority's refusal for a lock, its details read
// once: ends is how long until the lock ends, as the refusal says (its
// RetryInfo), if hasEnd; a lock without a TTL, or an authority that does
// not say, has none.
type lockRefusal struct {
	ends   time.Duration
	hasEnd bool
}

// lockRefusalOf reports whether err is the authority's refusal for a lock
// (PERMISSION_DENIED, reason locked), and reads it.
func lockRefusalOf(err error) (lockRefusal, bool) {
	if status.Code(err) != codes.PermissionDenied || errinfo.Reason(err) != "locked" {
		return lockRefusal{}, false
	}
	d, ok := errinfo.RetryDelay(err)
	return lockRefusal{ends: d, hasEnd: ok}, true
}

// wait is lockedWait's: until the lock ends, at most lockedRecheck, never
// less than floor, plus jitter.
func (l lockRefusal) wait(floor time.Duration) time.Duration {
	base := lockedRecheck
	if l.hasEnd && l.ends < base {
		base = max(l.ends, floor)
	}
	spread := min(max(base/10, time.Second), lockedJitterMax)
	return base + rand.N(spread+1)
}

// nextFloor is the least wait after the refusal following this one
// (retryIf's lockFloor): doubled, up to backoffMax, if this lock ends
// sooner than floor, else backoffMin.
func (l lockRefusal) nextFloor(floor time.Duration) time.Duration {
	if l.hasEnd && l.ends < floor {
		return min(floor*2, backoffMax)
	}
	return backoffMin
}

// Transient reports whether a failure may go away by itself: the authority
// unreachable, overloaded or slow (UNAVAILABLE, DEADLINE_EXCEEDED,
// RESOURCE_EXHAUSTED) or a network error. Any other answer of the
// authority is permanent: a wrong token will not become right.
func Transient(err error) bool {
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		switch se.GRPCStatus().Code() {
		case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted:
			return true
		}
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded)
}

// Run joins first if the data directory holds no identity, with the
// request join returns (called only then), and then renews the identity at
// about half of each certificate's lifetime, with jitter, until ctx ends.
// Transient failures are retried with exponential backoff (1 s doubling to
// 5 min, jittered, never waiting past the certificate's expiry). A refusal
// for a lock is waited out: until the lock's end the authority names (plus
// jitter), at most lockedRecheck, which is also how often a lock without a
// TTL is asked about again (lockedWait); no restart is needed when a lock
// ends or is deleted. Any other permanent failure ends Run with its
// *OpError. An identity on disk is
// never removed. Run returns nil once ctx is cancelled.
func (a *Agent) Run(ctx context.Context, join func() (JoinRequest, error)) error {
	err := a.run(ctx, join)
	a.authConn.close()
	if ctx.Err() != nil {
		a.log.Info("agent stopped")
		return nil
	}
	if err != nil {
		args := []any{"err", a.logged(err)}
		if r := errinfo.Reason(err); r != "" {
			// The authority's machine-readable reason (locked,
			// superseded, …), for log queries and alerts.
			args = append(args, "reason", r)
		}
		a.log.Error("agent stopped: permanent failure", args...)
	}
	return err
}

func (a *Agent) run(ctx context.Context, join func() (JoinRequest, error)) error {
	if !a.dir.HasIdentity() {
		if join == nil {
			return &OpError{Op: "join", Err: ErrNoIdentity}
		}
		req, err := join()
		if err != nil {
			return &OpError{Op: "join", Err: err}
		}
		req.Force = false
		a.log.Info("no identity yet: joining", "node", req.Node, "authority", req.Authority, "join_method", req.method(), "token_id", req.Token.ID)
		retryable := Transient
		if req.method() == JoinMethodBoundKeypair {
			retryable = retryableBound
		}
		if err := a.retryIf(ctx, "join", time.Time{}, retryable, func() error {
			_, err := a.Join(ctx, req)
			return err
		}); err != nil {
			return err
		}
	}
	// The stream runs beside the renewals, on whichever certificate is
	// current when it (re)connects, and stops with them.
	sctx, stop := context.WithCancel(ctx)
	streamDone := make(chan struct{})
	go func() { defer close(streamDone); a.keepStream(sctx) }()
	defer func() { stop(); <-streamDone }()
	var (
		scheduled string
		due       time.Time
	)
	for {
		st, leaf, err := a.current(ctx)
		if err != nil {
			return &OpError{Op: "renewal", Err: err}
		}
		a.metrics.observe(st)
		if serial := serialOf(leaf); serial != scheduled {
			scheduled, due = serial, a.renewAt(st, leaf)
			a.log.Info("identity loaded", "node", st.NodeID, "instance", st.InstanceID, "generation", st.Generation,
				"not_after", leaf.NotAfter, "next_renewal", due)
		}
		bound := st.JoinMethod == JoinMethodBoundKeypair
		if !a.now().Before(leaf.NotAfter) {
			if !bound {
				return &OpError{Op: "renewal", Err: &ExpiredError{NotAfter: leaf.NotAfter, Dir: a.dir, Node: st.NodeID}}
			}
			// A bound-keypair agent recovers by proving its key again; a
			// spent budget is retried, for an operator may raise it.
			a.log.Warn("certificate expired: recovering with the bound key", "not_after", leaf.NotAfter,
				"recoveries_remaining", remainingOf(st))
			if err := a.retryIf(ctx, "recovery", time.Time{}, retryableBound, func() error {
				_, err := a.Rebind(ctx)
				return err
			}); err != nil {
				return err
			}
			continue
		}
		if wait := due.Sub(a.now()); wait > 0 {
			t := time.NewTimer(min(wait, maxSleep))
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
				// Look again: the identity may have been renewed
				// meanwhile (muster agent renew).
				continue
			case <-a.standingRefused:
				// The authority refused the stream for the node's
				// standing: its answer to a renewal is the one that
				// stops the agent, or waits out a lock (or, a lock
				// gone meanwhile, renews).
				// Not a bound-keypair agent's: its refresh may recover,
				// and two copies would take the instance from each
				// other at every refusal.
				t.Stop()
				if bound {
					continue
				}
				a.log.Info("renewing now: the stream was refused for the node's standing, and the renewal's answer says whether the agent stops or waits out a lock")
			}
		}
		renew, retryable := a.Renew, Transient
		if bound {
			// A refresh repeats the challenge with the valid
			// certificate: the authority consumes nothing. It is a
			// recovery where the certificate has expired (the authority
			// away past it) or the store does not know it (restored
			// from a backup taken before it), so a spent budget is
			// retried here too, as at start: raising the limit brings
			// the agent back without a restart, as its hint says.
			renew, retryable = a.Rebind, retryableBound
		}
		if err := a.retryIf(ctx, "renewal", leaf.NotAfter, retryable, func() error {
			// A stream refused before this attempt is answered by it:
			// left pending, its signal would renew again at once after
			// a success (a refusal waited out meanwhile, say).
			drainWake(a.standingRefused)
			_, err := renew(ctx)
			if _, locked := lockRefusalOf(err); locked && !bound && !a.now().Before(leaf.NotAfter) {
				// Refused for a lock, and the certificate expired while
				// the request was out (sent just before the expiry, or
				// answered late): the next attempt is the one that
				// reports the expiry, without asking, so make it now
				// rather than after the lock's wait (up to
				// lockedRecheck, the expiry unreported all along). It
				// reads the identity on disk: one renewed meanwhile
				// (muster agent renew) is asked with instead. A
				// bound-keypair agent waits the lock out: it recovers
				// past the expiry.
				_, err = renew(ctx)
			}
			return err
		}); err != nil {
			return err
		}
	}
}

// current loads the identity with the directory locked, repairing what a
// crash left half done.
func (a *Agent) current(ctx context.Context) (*State, *x509.Certificate, error) {
	unlock, err := a.dir.lock(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer unlock()
	st, id, err := a.load(true)
	if err != nil {
		return nil, nil, err
	}
	return st, id.Leaf(), nil
}

// renewAt is about half-way (±10%) through the certificate's lifetime,
// counted from when the agent got it if state.json records that (the
// authority backdates NotBefore for clock skew).
func (a *Agent) renewAt(st *State, leaf *x509.Certificate) time.Time {
	start := leaf.NotBefore
	if st.Serial == serialOf(leaf) {
		got := st.JoinedAt
		if st.LastRenewal != nil {
			got = *st.LastRenewal
		}
		if got.After(start) && got.Before(leaf.NotAfter) {
			start = got
		}
	}
	half := leaf.NotAfter.Sub(start) / 2
	f := 1 + renewJitter*(2*rand.Float64()-1)
	return start.Add(time.Duration(float64(half) * f))
}

// retry runs f until it succeeds, fails permanently, or ctx ends, waiting
// between transient failures with jittered exponential backoff that never
// reaches past notAfter (when set): the last attempt is made before the
// certificate expires, and the one after it reports the expiry.
func (a *Agent) retry(ctx context.Context, op string, notAfter time.Time, f func() error) error {
	return a.retryIf(ctx, op, notAfter, Transient, f)
}

// retryIf is retry with retryable deciding which failures are retried.
func (a *Agent) retryIf(ctx context.Context, op string, notAfter time.Time, retryable func(error) bool, f func() error) error {
	delay := backoffMin
	// lockFloor is the least wait for a lock. It doubles, up to
	// backoffMax, with each refusal for a lock that ends sooner than it
	// (RetryInfo 0: the authority says the lock has ended, yet it still
	// refuses — its store's clock, which decides, behind its own), so
	// such a lock is asked about with backoff, not every second (each
	// refusal audited) for as long as the clocks disagree; any other
	// refusal for a lock starts it again from backoffMin.
	lockFloor := backoffMin
	for attempt := 1; ; attempt++ {
		// Only a stream opened since this attempt began ends the wait
		// after its failure: one opened before says nothing of now.
		drainWake(a.retryWake)
		err := f()
		if err == nil || ctx.Err() != nil {
			return err
		}
		var left time.Duration
		if !notAfter.IsZero() {
			left = notAfter.Sub(a.now())
		}
		if l, locked := lockRefusalOf(err); locked {
			// Not a failure of the authority, which answered: the
			// backoff starts again from its minimum after the lock.
			wait := l.wait(lockFloor)
			lockFloor = l.nextFloor(lockFloor)
			wait = cutToExpiry(wait, !notAfter.IsZero(), left)
			until := a.now().Add(wait)
			args := []any{"attempt", attempt, "retry_in", wait.Round(time.Millisecond).String(), "err", a.logged(err)}
			if l.hasEnd {
				args = append(args, "lock_ends_in", l.ends.Round(time.Second).String())
			} else {
				args = append(args, "lock_ends", "when deleted (muster lock delete LOCK-ID)")
			}
			a.log.Warn(op+" refused: locked; asking again", args...)
			if !a.pause(ctx, wait, until) {
				return ctx.Err()
			}
			delay = backoffMin
			continue
		}
		if !retryable(err) {
			return err
		}
		wait := retryWait(delay, !notAfter.IsZero(), left)
		until := a.now().Add(wait)
		if spentBudget(err) {
			// The authority answered, and will answer the same until an
			// operator raises the limit, which the agent cannot see: a
			// stream's probe that the authority is reachable says
			// nothing new, so it wakes nothing (it woke every refused
			// recovery at the stream's pace before). The recovery asks
			// again at its own backoff, growing to backoffMax.
			a.log.Warn(op+" failed; retrying", "attempt", attempt, "retry_in", wait.Round(time.Millisecond).String(),
				"woken_by_stream", false, "err", a.logged(err))
			if !a.pause(ctx, wait, until) {
				return ctx.Err()
			}
			delay = min(delay*2, backoffMax)
			continue
		}
		a.log.Warn(op+" failed; retrying", "attempt", attempt, "retry_in", wait.Round(time.Millisecond).String(), "err", a.logged(err))
		// A stream to the authority opening meanwhile ends the wait
		// (the authority is back: a bound-keypair agent whose stream
		// reconnected after a long outage waited up to backoffMax more
		// to refresh or recover). The delay still doubles, so a
		// flapping authority is asked at most once per stream
		// reconnection, which backs off on its own.
		switch a.pauseOr(ctx, wait, until, a.retryWake) {
		case pauseCancelled:
			return ctx.Err()
		case pauseWoken:
			a.log.Info("a stream to the authority opened: retrying now", "op", op)
		}
		delay = min(delay*2, backoffMax)
	}
}

// lastTryAhead is how long before the certificate's expiry a wait cut
// short by it ends (at most half of what is left), so that the attempt
// after it is made while the certificate is still valid.
const lastTryAhead = 5 * time.Second

// retryWait is the wait before the next attempt: drawn from [delay/2,
// delay]. With an expiry (expires), left before it, a wait that would
// reach it is cut to end before it (lastTryAhead, or half of what is
// left), so the last attempts are made while the certificate is valid:
// an attempt at the expiry itself finds it expired and does not ask (an
// agent whose authority came back 10 s before its expiry waited until
// the expiry, then stopped). Within backoffMin of the expiry the wait
// ends at it, and the attempt then reports the expiry. Once it has
// passed, the backoff holds as in any other state — cutting to what is
// left then (nothing) would retry with no wait at all, a busy loop while
// the authority is unreachable.
func retryWait(delay time.Duration, expires bool, left time.Duration) time.Duration {
	return cutToExpiry(delay/2+rand.N(delay/2+1), expires, left)
}

// cutToExpiry is retryWait's cut of a wait that would reach the
// certificate's expiry, for any wait (a lock's too: an agent locked past
// its certificate's expiry makes its last attempt while it is valid, then
// reports the expiry rather than waiting on).
func cutToExpiry(wait time.Duration, expires bool, left time.Duration) time.Duration {
	if expires && left > 0 && wait >= left {
		wait = left
		if left > backoffMin {
			wait = left - min(left/2, lastTryAhead)
		}
	}
	return wait
}

// pause waits d, or until the agent's clock reads until, whichever
// comes first, or until ctx ends; it reports whether the wait ended
// (false: ctx ended). The clock is looked at every maxSleep: a timer does
// not count the time a machine is suspended, so a locked agent (a wait of
// up to lockedRecheck) or one backing off (up to backoffMax) whose machine
// slept past the lock's end or its certificate's expiry would otherwise
// wait the whole interval again after it wakes, its recovery or its
// expiry's report delayed by as much.
func (a *Agent) pause(ctx context.Context, d time.Duration, until time.Time) bool {
	return a.pauseOr(ctx, d, until, nil) != pauseCancelled
}

// pauseEnd says why a pause ended.
type pauseEnd int

const (
	pauseCancelled pauseEnd = iota // ctx ended
	pauseElapsed                   // d elapsed, or the clock reached until
	pauseWoken                     // wake was signalled
)

// pauseOr is pause that also ends when wake is signalled (a nil wake
// never is).
func (a *Agent) pauseOr(ctx context.Context, d time.Duration, until time.Time, wake <-chan struct{}) pauseEnd {
	t := time.NewTimer(d)
	defer t.Stop()
	look := time.NewTicker(maxSleep)
	defer look.Stop()
	for {
		select {
		case <-ctx.Done():
			return pauseCancelled
		case <-wake:
			return pauseWoken
		case <-t.C:
			return pauseElapsed
		case <-look.C:
			if !a.now().Before(until) {
				return pauseElapsed
			}
		}
	}
}
