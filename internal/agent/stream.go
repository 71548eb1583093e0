package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/muster-dev/muster/internal/errinfo"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/shellword"
	"github.com/muster-dev/muster/internal/spiffeid"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// Stream timing; variables so tests can shorten them.
var (
	heartbeatEvery = 30 * time.Second
	// streamBackoffMin and streamBackoffMax bound the wait before a
	// reconnection. Every wait is drawn uniformly from [0, delay] (full
	// jitter), so agents cut off together by an authority restart come
	// back spread over the whole window instead of in one second.
	streamBackoffMin = time.Second
	streamBackoffMax = 2 * time.Minute
	// streamStable is how long a stream must have lasted for the backoff
	// to start again from its minimum.
	streamStable = time.Minute
	// streamJitter draws a reconnection's wait from [0, delay].
	streamJitter = func(delay time.Duration) time.Duration { return rand.N(delay + 1) }
)

// keepStream holds the agent's stream to the authority open until ctx
// ends, reconnecting with jittered exponential backoff. It takes each
// verifier set the authority sends, and sends heartbeats.
//
// A stream ends by design when the certificate it was opened with expires
// (the authority closes it at NotAfter), which, with a renewal at
// half-life, is after the agent renewed: such an end is no failure, and
// the agent reconnects with its new certificate within streamBackoffMin,
// the backoff starting again from there. Only the other ends (the
// authority unreachable, a refusal) let the backoff grow.
//
// A renewal that succeeds while the stream waits to reconnect ends the
// wait (streamWake): the authority is back, and the stream — tasks,
// verifier sets, trust bundles — need not wait out a backoff grown to
// minutes while it was down. The backoff itself is kept: a renewal that
// succeeded before the stream ended says nothing of now (the authority
// may be flapping) and wakes nothing, and a stream that fails again
// after a wake waits the doubled delay.
func (a *Agent) keepStream(ctx context.Context) {
	// Tasks run beside the streams, and stop with the agent.
	tasks := newTaskRunner(ctx, a)
	defer tasks.wait()
	delay := streamBackoffMin
	waiting := false
	for {
		if notAfter, expired := a.certExpired(ctx); expired {
			// The authority refuses a stream opened with an expired
			// certificate (each refusal audited): the stream waits for
			// the recovery (or a renewal, muster agent renew) to give
			// the agent a valid one, which wakes it. Meanwhile it tells
			// the recovery, which backs off while the authority is
			// unreachable, when the authority answers again.
			if !waiting {
				a.log.Info("certificate expired: the stream to the authority waits for the recovery or renewal to give the agent a valid one",
					"not_after", notAfter)
				waiting = true
			}
			drainWake(a.streamWake)
			// A recovery that succeeded between the read above and the
			// drain woke the stream: look again, or that wake is lost
			// and the stream waits out its backoff with a valid one.
			if _, still := a.certExpired(ctx); !still {
				continue
			}
			if a.authorityReachable(ctx) {
				wake(a.retryWake)
			}
			wait := streamJitter(delay)
			if !a.waitReconnect(ctx, wait, a.now().Add(wait)) {
				return
			}
			delay = min(delay*2, streamBackoffMax)
			continue
		}
		if waiting {
			waiting, delay = false, streamBackoffMin
		}
		start := a.now()
		opened, err := a.streamOnce(ctx, tasks)
		if ctx.Err() != nil {
			return
		}
		// Only a renewal after this end wakes the wait below.
		drainWake(a.streamWake)
		renewed := a.outlived(opened, start)
		if renewed || a.now().Sub(start) >= streamStable {
			delay = streamBackoffMin
		}
		wait := streamJitter(delay)
		r := standingRefusal(err)
		if lw, locked := lockedWait(err, backoffMin); !renewed && locked && lw > wait {
			// Asking before the lock ends is refused again: the stream
			// waits as the renewal does, and a renewal that succeeds (the
			// lock deleted) wakes it.
			wait = lw
		}
		until := a.now().Add(wait)
		if renewed {
			a.log.Info("stream to the authority closed with the certificate it was opened with; reconnecting with the current one",
				"retry_in", wait.Round(time.Millisecond).String())
		} else if r != "" {
			// The way out, with this agent's own directory, as the
			// renewal's refusal names it (which follows at once).
			if st, serr := a.dir.ReadState(); serr == nil {
				err = standingHint(err, st, a.dir)
			}
			a.log.Warn("stream to the authority closed: refused for the node's standing", "reason", r,
				"retry_in", wait.Round(time.Millisecond).String(), "err", a.logged(err))
			wake(a.standingRefused)
		} else {
			a.log.Warn("stream to the authority closed; reconnecting", "retry_in", wait.Round(time.Millisecond).String(), "err", a.logged(err))
		}
		a.metrics.streamClosed()
		if !a.waitReconnect(ctx, wait, until) {
			return
		}
		delay = min(delay*2, streamBackoffMax)
	}
}

// certExpired reports whether the agent's current certificate has
// expired, with its end; false when there is none to read (the stream's
// attempt then says why).
func (a *Agent) certExpired(ctx context.Context) (time.Time, bool) {
	_, id, err := a.loadLocked(ctx)
	if err != nil {
		return time.Time{}, false
	}
	notAfter := id.Leaf().NotAfter
	return notAfter, !a.now().Before(notAfter)
}

// authorityReachable reports whether the authority completes a TLS
// handshake, without a client certificate (as a recovery dials it) and
// without a call, so nothing is refused or audited.
func (a *Agent) authorityReachable(ctx context.Context) bool {
	st, id, err := a.loadLocked(ctx)
	if err != nil {
		return false
	}
	authorityID, err := spiffeid.New(st.TrustDomain, spiffeid.RoleAuthority, st.AuthorityID)
	if err != nil {
		return false
	}
	cfg := identity.ClientTLS(nil, id.RootPool(), identity.MatchID(authorityID))
	cfg.NextProtos = []string{"h2"}
	dctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	conn, err := (&tls.Dialer{Config: cfg}).DialContext(dctx, "tcp", a.address(st))
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

// logged is err as the agent logs it: a way out the authority names with
// --data ADIR (it cannot know the agent's directory) names this agent's,
// so the line can be pasted as it is.
func (a *Agent) logged(err error) string {
	if err == nil {
		return ""
	}
	return strings.ReplaceAll(err.Error(), "--data ADIR ", "--data "+shellword.Quote(string(a.dir))+" ")
}

// standingRefusal is the reason of a stream refused for the node's
// standing (locked, deleted, superseded, copy_detected, or
// certificate_unknown: a store restored from a backup taken before this
// agent's last renewal; issuer_unknown, UNAUTHENTICATED: one taken before
// its certificate's intermediate), or "".
func standingRefusal(err error) string {
	if status.Code(err) == codes.Unauthenticated && errinfo.Reason(err) == errinfo.ReasonIssuerUnknown {
		// Its issuer is none the authority holds (a store restored from
		// before that intermediate): as certificate_unknown, the renewal
		// asked at once is refused too, and stops the agent with the join.
		return errinfo.ReasonIssuerUnknown
	}
	if status.Code(err) != codes.PermissionDenied {
		return ""
	}
	switch r := errinfo.Reason(err); r {
	case "locked", "deleted", "superseded", "copy_detected", "certificate_unknown":
		return r
	}
	return ""
}

// waitReconnect waits d (until the agent's clock reads until), or less
// if a renewal succeeds meanwhile; it reports false when ctx ended.
// Like the renewal's waits it looks at the agent's clock every maxSleep
// (pauseOr): a stream waiting out a lock (up to
// lockedRecheck) whose machine slept past the lock's end reconnects when
// it wakes, not a whole interval later.
func (a *Agent) waitReconnect(ctx context.Context, d time.Duration, until time.Time) bool {
	switch a.pauseOr(ctx, d, until, a.streamWake) {
	case pauseCancelled:
		return false
	case pauseWoken:
		a.log.Info("the authority answered a renewal: reconnecting the stream now")
	}
	return true
}

// authorityAnswered wakes a stream waiting to reconnect (keepStream): a
// renewal, refresh or recovery just succeeded.
func (a *Agent) authorityAnswered() {
	wake(a.streamWake)
}

// outlived reports whether opened, the certificate a stream was opened
// with at start, has expired since or been replaced by a renewal: the
// stream's end was then its certificate's, not a failure. A certificate
// already expired at start did not outlive the stream: the authority
// refuses it at once, and the agent, waiting for a recovery (a spent
// budget is retried for as long as it takes), must back off rather than
// open a stream every second with it.
func (a *Agent) outlived(opened *x509.Certificate, start time.Time) bool {
	if opened == nil {
		return false
	}
	if !a.now().Before(opened.NotAfter) && start.Before(opened.NotAfter) {
		return true
	}
	_, id, err := a.loadLocked(context.Background())
	return err == nil && serialOf(id.Leaf()) != serialOf(opened)
}

// streamOnce opens one stream with the current certificate and serves it
// until it ends. It returns the certificate it opened the stream with, nil
// if it could not load one.
func (a *Agent) streamOnce(ctx context.Context, tasks *taskRunner) (*x509.Certificate, error) {
	st, id, err := a.loadLocked(ctx)
	if err != nil {
		return nil, err
	}
	return id.Leaf(), a.serveStream(ctx, st, id, tasks)
}

// serveStream opens one stream with id and serves it until it ends. Its
// receive loop never waits for a task to run: tasks go to tasks, and their
// answers come back through a sender of their own.
func (a *Agent) serveStream(ctx context.Context, st *State, id *identity.Identity, tasks *taskRunner) error {
	authorityID, err := spiffeid.New(st.TrustDomain, spiffeid.RoleAuthority, st.AuthorityID)
	if err != nil {
		return err
	}
	conn, err := dial(a.address(st), identity.ClientTLS(id, id.RootPool(), identity.MatchID(authorityID)))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	// The stream's senders read the agent's directory (a heartbeat takes
	// its lock, creating certs/ and keys/ if missing): they end before
	// the stream does, so an agent told to stop writes nothing after
	// keepStream returned.
	var senders sync.WaitGroup
	defer func() { cancel(); senders.Wait() }()
	stream, err := musterv1.NewAgentServiceClient(conn).Connect(ctx)
	if err != nil {
		return err
	}
	a.log.Info("stream to the authority open", "authority", a.address(st))
	// A renewal, refresh or recovery backing off after the authority
	// was unreachable need not wait out a backoff grown to minutes.
	wake(a.retryWake)

	// A gRPC stream takes one sender at a time.
	var sendMu sync.Mutex
	send := func(m *musterv1.AgentMessage) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(m)
	}
	sendErr := make(chan error, 2)
	senders.Go(func() {
		t := time.NewTicker(heartbeatEvery)
		defer t.Stop()
		for {
			if err := a.sendHeartbeat(ctx, send); err != nil {
				sendErr <- err
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case <-a.trustChanged:
				// A new verifier set is reported at once, so agents
				// show says what agent status says.
			}
		}
	})
	senders.Go(func() {
		if err := a.sendAnswers(ctx, tasks, send); err != nil {
			sendErr <- err
		}
	})
	for {
		m, err := stream.Recv()
		if err != nil {
			select {
			case serr := <-sendErr:
				return errors.Join(err, serr)
			default:
				return err
			}
		}
		if raw := m.GetTask(); raw != nil {
			// Verified and remembered here, in the order the authority
			// queued them; run apart, one of a type at a time.
			tasks.submit(raw)
		}
		if raw := m.GetVerifierSet(); raw != nil {
			if err := a.streamedVerifierSet(ctx, raw, conn); err != nil {
				a.log.Warn("could not record a streamed verifier set", "err", err)
			}
		}
		if b := m.GetTrustBundle(); b != nil {
			if err := a.streamedBundle(ctx, b); err != nil {
				a.log.Warn("could not record a streamed trust bundle", "err", err)
			}
		}
	}
}

// sendAnswers sends the tasks' answers as they come until ctx ends or a
// send fails (the answer is kept for the next stream), each batch
// followed by a heartbeat: what a task changed (a staged signer, a
// refusal count) is reported at once, not at the next heartbeat.
func (a *Agent) sendAnswers(ctx context.Context, tasks *taskRunner, send func(*musterv1.AgentMessage) error) error {
	for {
		sent := false
		for res := tasks.next(); res != nil; res = tasks.next() {
			if err := send(&musterv1.AgentMessage{Body: &musterv1.AgentMessage_Result{Result: res}}); err != nil {
				tasks.requeue(res)
				return err
			}
			sent = true
		}
		if sent {
			if err := a.sendHeartbeat(ctx, send); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tasks.ready:
		}
	}
}

// loadLocked loads state and identity with the directory locked.
func (a *Agent) loadLocked(ctx context.Context) (*State, *identity.Identity, error) {
	unlock, err := a.dir.lock(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer unlock()
	return a.load(true)
}

// streamedVerifierSet takes a verifier set the stream brought, by the rule
// of a renewal's (catching up over conn, the stream's connection), and
// records it.
func (a *Agent) streamedVerifierSet(ctx context.Context, raw []byte, conn grpc.ClientConnInterface) error {
	unlock, err := a.dir.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	st, err := a.dir.ReadState()
	if err != nil {
		return err
	}
	if !a.takeVerifierSet(ctx, st, raw, false, conn) {
		return nil
	}
	return a.dir.writeState(st)
}

// streamedBundle takes a trust bundle the stream brought and records it;
// the next heartbeat reports it at once.
func (a *Agent) streamedBundle(ctx context.Context, b *musterv1.TrustBundle) error {
	unlock, err := a.dir.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	st, id, err := a.load(true)
	if err != nil {
		return err
	}
	before := st.TrustBundle
	if _, err := a.takeBundle(st, id, b); err != nil {
		return err
	}
	if st.TrustBundle == before {
		return nil
	}
	if err := a.dir.writeState(st); err != nil {
		return err
	}
	wake(a.trustChanged)
	return nil
}

// sendHeartbeat sends the agent's heartbeat, or nothing when it has none
// to give (see heartbeat); the next one follows at the next tick.
func (a *Agent) sendHeartbeat(ctx context.Context, send func(*musterv1.AgentMessage) error) error {
	hb := a.heartbeat(ctx)
	if hb == nil {
		return nil
	}
	return send(&musterv1.AgentMessage{Body: &musterv1.AgentMessage_Heartbeat{Heartbeat: hb}})
}

// heartbeat is the agent's report of itself, or nil when its state cannot
// be read (the agent stopping, a state file being replaced): the authority
// keeps each heartbeat whole in place of the last, so an empty one would
// report an agent that holds no identity, verifier set or budget.
func (a *Agent) heartbeat(ctx context.Context) *musterv1.Heartbeat {
	st, id, err := a.loadLocked(ctx)
	if err != nil {
		if ctx.Err() == nil {
			a.log.Warn("heartbeat skipped: cannot read the agent's state", "err", err)
		}
		return nil
	}
	hb := &musterv1.Heartbeat{}
	hb.IdentityNotAfter = timestamppb.New(id.Leaf().NotAfter)
	hb.LastRotateTask, hb.VerificationFailures = st.LastRotateTask, a.failureCounts()
	if n := st.RecoveriesRemaining; n != nil && *n >= 0 {
		hb.RecoveriesRemaining = n
	}
	hb.TrustBundleDigest = st.TrustBundle
	if held, err := a.dir.heldBundle(); err == nil {
		hb.TrustBundleCerts = held
	} else {
		a.log.Warn("cannot read the trust bundle held", "err", err)
	}
	if t, err := a.trustOf(st); err == nil {
		hb.VerifierSetVersion = t.Version()
		hb.VerifierSet = t.Raw()
		hb.StaticVerifiers = int32(len(t.StaticKeys()))
		hb.AcceptedSigners = map[string]string{}
		for v, s := range t.Accepted(a.now()) {
			hb.AcceptedSigners[v] = string(s)
		}
	}
	return hb
}
