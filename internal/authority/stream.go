package authority

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/enroll"
	"github.com/muster-dev/muster/internal/signer"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/task"
	"github.com/muster-dev/muster/internal/trustbundle"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// streamCheckEvery is how often open agent streams re-check the store when
// the store cannot announce changes (changeWatcher). Both backends can, and
// then a stream re-checks only when woken by a change that concerns it.
var streamCheckEvery = 500 * time.Millisecond

// streamSendTimeout bounds one message sent to an agent: a client that
// stops reading leaves the server's Send waiting under HTTP/2 flow control,
// and past this its stream is closed. While a send waits, the stream
// still answers a change to its standing (a lock, a deletion, a
// supersession) at once: the stream is closed then, not at the deadline.
var streamSendTimeout = 10 * time.Second

// slowSend is how long a send waits before it is counted in
// muster_agent_stream_sends_waiting and logged: an agent that reads keeps
// its window open, so a wait this long means it stopped.
const slowSend = time.Second

// Connect serves an agent's stream (see agent.proto).
//
// This goroutine waits for the stream's whole life, and so does the
// receive loop. Everything else a stream does — opening it (its standing,
// its record, the log line), every re-check a change wakes it for, and
// recording its end — runs apart (stack.go), and the wait itself is kept
// shallow: gRPC's frames and the interceptors' already take about 2.3 KiB
// of the handler's stack, and a goroutine whose deepest call fits in the
// 4 KiB it starts with (less the runtime's guard of 928 bytes) keeps 4
// KiB instead of growing to 8 KiB for good (the runtime halves a stack
// only while less than a quarter of it is used, which 2.3 KiB of 8 is not).
func (a *agentService) Connect(stream musterv1.AgentService_ConnectServer) (err error) {
	st := &agentStream{a: a, stream: stream}
	defer st.finish(&err)
	if apart(func() { err = st.open() }); err != nil {
		return err
	}
	return st.serve()
}

// finish records the stream's end, once it opened, apart, and answers a
// panic of the stream's — the handler's own, or one apart or in the
// receive loop carried to it — in *err (recover.go). One deferred call of
// two words does both, so the handler's frame, under the stream's whole
// wait, does not grow.
func (st *agentStream) finish(err *error) {
	answer := func(r any) {
		*err = st.a.s.panicAnswer(st.stream.Context(), musterv1.AgentService_Connect_FullMethodName, r)
	}
	if r := recover(); r != nil {
		answer(r)
	}
	if st.opened {
		// A panic recording the end is answered too.
		defer func() {
			if r := recover(); r != nil {
				answer(r)
			}
		}()
		apart(st.close)
	}
}

// agentStream is an open agent stream.
type agentStream struct {
	a      *agentService
	stream musterv1.AgentService_ConnectServer
	// ctx ends with the stream or when the certificate it was opened with
	// expires.
	ctx    context.Context
	cancel context.CancelFunc
	// replaced ends ctx with its cause when a newer stream of the same
	// agent replaces this one (streamlive.go), or the authority stops
	// (errStopping; unstop forgets the stream's end at the stop).
	replaced context.CancelCauseFunc
	unstop   func() bool
	c        Caller
	wake     *streamWake
	unsub    func()
	row      store.AgentStream
	// tookFrom is the connection identity of the stream this one
	// replaced in the store's row, on any replica, when they are two
	// holders of the agent's identity (record), and alternations how
	// many times in a row the two took the row from each other.
	tookFrom     string
	alternations int
	// recvErr is the receive loop's end.
	recvErr chan error
	// opened: open succeeded, and the end is to be recorded.
	opened bool

	// A heartbeat being recorded as the stream ends must not mark the
	// stream connected again after its end is recorded: the two writes are
	// serialised, and no heartbeat is recorded once the end is.
	recordMu sync.Mutex
	ended    bool

	// deferred are the changes a stream was woken for while a send
	// waited (send), for serve to re-check next. Only the goroutine
	// running recheck writes it, and serve reads it after that returned.
	deferred store.ChangeKind

	// tasks are the tasks this stream sent, with their types.
	tasks sentTasks
}

// sentTasks are the tasks a stream sent, by ID, with their types: serve
// sends each once, and the receive loop names the type in the way out of
// a refused answer.
type sentTasks struct {
	mu    sync.Mutex
	types map[string]string
}

// add records that the task id of type typ was sent, and reports whether
// it was not yet.
func (t *sentTasks) add(id, typ string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.types[id]; ok {
		return false
	}
	if t.types == nil {
		t.types = map[string]string{}
	}
	t.types[id] = typ
	return true
}

// typeOf is the type of the task id this stream sent, or "".
func (t *sentTasks) typeOf(id string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.types[id]
}

// open checks the caller's standing, records the stream and starts its
// receive loop. On an error nothing is left open.
func (st *agentStream) open() error {
	a := st.a
	ctx := st.stream.Context()
	st.c, st.recvErr = callerFrom(ctx), make(chan error, 1)
	c := st.c
	// Unless the stream opens, nothing is left: on a refusal, an error or
	// a panic.
	defer func() {
		if !st.opened && st.unsub != nil {
			st.unsub()
		}
		if !st.opened && st.cancel != nil {
			st.cancel()
			st.replaced(nil)
			st.unstop()
		}
	}()
	// Subscribed before the first check, so a change committed after that
	// check wakes the stream.
	st.wake, st.unsub = a.s.hub.subscribe(c.ID.Name)
	// A stream never outlives the certificate it was opened with.
	base, replaced := context.WithCancelCause(ctx)
	st.ctx, st.cancel = context.WithDeadline(base, c.Cert.NotAfter)
	st.replaced = replaced
	st.unstop = func() bool { return false }
	if a.s.stopping != nil { // nil in a Server a test made by hand
		st.unstop = context.AfterFunc(a.s.stopping, func() { replaced(errStopping) })
	}
	if err := a.standing(ctx); err != nil {
		return err
	}
	if err := st.record(); err != nil {
		return toStatus(ctx, a.s.log, err)
	}
	// Recorded: from here its end is recorded (close), whatever follows.
	st.opened = true
	a.s.streams.connected.Inc()
	a.streamLog(c).Info("agent stream opened")
	st.replaceOld()
	go st.receive()
	return nil
}

// close records the stream's end (the receive loop ends with the stream:
// gRPC ends its Recv when the handler returns).
func (st *agentStream) close() {
	a := st.a
	// Released even if recording the end panics (finish answers it).
	defer func() {
		a.s.streams.connected.Dec()
		st.cancel()
		st.unsub()
		a.s.live.drop(st)
		if st.replaced != nil {
			st.replaced(nil)
			st.unstop()
		}
	}()
	if err := st.recordEnd(); err != nil {
		// Recorded later (pendingEnds), so the agent is not listed
		// connected for good.
		if !a.s.outage.fail(err) {
			a.streamLog(st.c).Error("cannot record the stream's end; retrying", "err", err)
		}
		a.s.streamEnds.add(st.row.NodeID, st.row.ConnectedAt, time.Now().UTC())
	}
}

// recordEnd records the stream's end; no heartbeat is recorded after it.
func (st *agentStream) recordEnd() error {
	a := st.a
	st.recordMu.Lock()
	defer st.recordMu.Unlock()
	st.ended = true
	rctx, cancel := context.WithTimeout(context.WithoutCancel(st.ctx), storeJobTimeout)
	defer cancel()
	now, err := a.s.store.Now(rctx)
	if err == nil {
		err = a.s.store.CloseAgentStream(rctx, st.row.NodeID, st.row.ConnectedAt, now)
	}
	return err
}

// receive reads the agent's messages until the stream ends: task results
// and heartbeats are recorded, apart.
func (st *agentStream) receive() {
	// A panic here would end the process: it is logged here, where it
	// happened (the stream may be ending another way, and never read
	// recvErr), and ends the stream with the call's INTERNAL answer.
	var p error
	defer func() {
		if p != nil {
			st.recvErr <- panicEnd{st.a.s.panicAnswer(st.stream.Context(), musterv1.AgentService_Connect_FullMethodName, p)}
		}
	}()
	defer catch(&p)
	for {
		m, err := st.stream.Recv()
		if err != nil {
			st.recvErr <- err
			return
		}
		if r := m.GetResult(); r != nil {
			apart(func() { st.recordResult(r) })
		}
		if hb := m.GetHeartbeat(); hb != nil {
			st.a.s.streams.heartbeats.Inc()
			apart(func() {
				st.recordMu.Lock()
				defer st.recordMu.Unlock()
				if !st.ended && errors.Is(st.a.s.recordHeartbeat(st.ctx, st.row, hb), store.ErrConflict) {
					// A newer stream of the agent took the row, on some
					// replica: this one ends.
					st.supplanted()
				}
			})
		}
	}
}

// resultRecordTimeout bounds recording one task result: past the store's
// own deadline (storeJobTimeout).
const resultRecordTimeout = storeJobTimeout

// recordResult records a task result the stream brought. A result that
// arrives as the stream ends (its certificate expiring, a newer stream
// replacing it, the authority stopping, a lock) is the agent's answer all
// the same: recorded with the stream's context it would be lost until the
// task was sent again on a later stream, so it is recorded with a context
// that outlives the stream, bounded by its own timeout.
func (st *agentStream) recordResult(r *musterv1.TaskResult) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(st.ctx), resultRecordTimeout)
	defer cancel()
	st.a.s.taskResult(ctx, st.c.ID.Name, r, st.tasks.typeOf(r.GetTaskId()))
}

// serve waits for what ends the stream, and re-checks what a change it is
// woken by concerns: its standing (a lock, deletion, supersession), the
// verifier set (a signer step) or its tasks; an idle stream asks the store
// nothing.
func (st *agentStream) serve() error {
	var sent int64 = -1 // the version of the last set sent
	// standing was checked as it opened; the trust bundle is sent at open.
	check := store.ChangeSigners | store.ChangeTasks | store.ChangeCA
	sentBundle := "" // the digest of the last trust bundle sent
	for {
		var end error
		if apart(func() {
			if check&store.ChangeStream != 0 && st.supplanted() {
				end = streamEnd{st.expired()}
				return
			}
			end = st.a.recheck(st.ctx, st.send, st.c, check, &sent, &sentBundle, &st.tasks)
		}); end != nil {
			if se, ok := end.(streamEnd); ok {
				return se.err
			}
			return end
		}
		if check, st.deferred = st.deferred, 0; check != 0 {
			continue // woken while a send waited
		}
		select {
		case err := <-st.recvErr:
			return st.closedByAgent(err)
		case <-st.ctx.Done():
			return st.expired()
		case <-st.wake.c:
			check = st.wake.take()
		}
	}
}

// send sends m to the agent, waiting at most streamSendTimeout. While it
// waits, the stream's end (the agent's, the certificate's) ends it, and a
// change to its standing is checked at once: a lock closes a stream whose
// agent stopped reading as fast as any other. Other changes wait in
// deferred. The Send left waiting returns when the handler does.
func (st *agentStream) send(m *musterv1.AuthorityMessage) error {
	done := make(chan error, 1)
	go func() { done <- st.stream.Send(m) }()
	timer := time.NewTimer(streamSendTimeout)
	defer timer.Stop()
	slow := time.NewTimer(slowSend)
	defer slow.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-slow.C:
			if m := st.a.s.metrics; m != nil {
				m.streamSendsWaiting.Inc()
				defer m.streamSendsWaiting.Dec()
			}
			st.a.streamLog(st.c).Info("a send to an agent stream waits: the agent is not reading", "waited", slowSend.String(), "deadline", streamSendTimeout.String())
		case <-timer.C:
			st.a.streamLog(st.c).Warn("agent stream closed: the agent did not read what was sent to it", "waited", streamSendTimeout.String())
			st.a.auditClose(st.ctx, st.c, fmt.Sprintf("the agent did not read what was sent to it for %s", streamSendTimeout))
			return status.Errorf(codes.DeadlineExceeded, "the agent did not read its stream for %s; reconnect", streamSendTimeout)
		case err := <-st.recvErr:
			return streamEnd{st.closedByAgent(err)}
		case <-st.ctx.Done():
			return streamEnd{st.expired()}
		case <-st.wake.c:
			k := st.wake.take()
			st.deferred |= k &^ store.ChangeStream
			if k&store.ChangeStream != 0 && st.supplanted() {
				return streamEnd{st.expired()}
			}
			if k&store.ChangeStanding != 0 {
				if err := st.a.s.enroll.Standing(st.ctx, st.c.Cert); err != nil && st.ctx.Err() == nil {
					st.a.streamLog(st.c).Info("agent stream closed while a send waited", "reason", err)
					st.a.auditClose(st.ctx, st.c, auditText(err))
					return toStatus(st.ctx, st.a.s.log, err)
				}
			}
		}
	}
}

// streamEnd is what send returns when the stream ended while it waited:
// err is the handler's answer (nil: none).
type streamEnd struct{ err error }

func (e streamEnd) Error() string { return "agent stream ended" }

// closedByAgent is the stream's end when its receive loop ended with err.
func (st *agentStream) closedByAgent(err error) error {
	if p, ok := err.(panicEnd); ok {
		// The receive loop panicked, and logged it.
		return p.status
	}
	st.a.streamLog(st.c).Info("agent stream closed by the agent", "err", err)
	if _, ok := status.FromError(err); ok && !errors.Is(err, io.EOF) {
		// A message that was refused (one that does not parse, or is too
		// large) ends the stream with its refusal, not OK.
		return err
	}
	return nil
}

// expired is the stream's end when its context ended: the certificate it
// was opened with expired, or the agent or the server went away.
func (st *agentStream) expired() error {
	if errors.Is(context.Cause(st.ctx), errReplaced) {
		st.a.streamLog(st.c).Info("agent stream closed: replaced by a newer stream of the same agent")
		return status.Error(codes.Aborted, "replaced by a newer stream of the same agent (one stream per agent)")
	}
	if errors.Is(context.Cause(st.ctx), errStopping) {
		st.a.streamLog(st.c).Info("agent stream closed: the authority is stopping")
		return status.Error(codes.Unavailable, "the authority is stopping; reconnect")
	}
	if errors.Is(context.Cause(st.ctx), context.DeadlineExceeded) && st.stream.Context().Err() == nil {
		// Not audited: this is how every stream ends, a renewal after the
		// agent renewed at half-life and opened its next one, so a record
		// per agent per certificate lifetime would say nothing.
		st.a.streamLog(st.c).Info("agent stream closed: certificate expired")
		return status.Error(codes.Unauthenticated, "the certificate this stream was opened with has expired; reconnect with the renewed one")
	}
	return nil
}

// auditClose records that the authority closed c's open stream, and why
// (a lock, a deletion, a supersession, an agent that stopped reading), as
// agent.stream_close. It goes through the flood
// guard, keyed by the agent's source, so an agent that reconnects into the
// same closure again and again cannot flood the audit chain: past the
// guard's cap its closures are counted in one api.access.flood record.
func (a *agentService) auditClose(ctx context.Context, c Caller, reason string) {
	a.s.refusals.Record(context.WithoutCancel(ctx), audit.Event{Actor: c.Actor(), Action: "agent.stream_close", Target: c.ID.Name,
		Result: audit.ResultDenied, Reason: "stream closed: " + reason, Source: c.Source, CorrelationID: c.CorrelationID})
}

// auditText is err as an audit record gives it: a refusal's reason with
// the detail only the audit log sees (the way out of an unknown
// certificate, the lock in force).
func auditText(err error) string {
	if ref := (*enroll.Refusal)(nil); errors.As(err, &ref) {
		return ref.AuditText()
	}
	return err.Error()
}

// streamLog is the logger of c's stream. It is made for each line, not
// kept for the stream's life: slog's With formats its attributes when it
// is called and keeps them (about 280 bytes a stream in a heap profile of
// 2,000 idle streams), and a stream writes a line only as it opens, ends
// or fails.
func (a *agentService) streamLog(c Caller) *slog.Logger {
	return a.s.log.With("node", c.ID.Name, "correlation_id", c.CorrelationID)
}

// recheck does what a change a stream was woken by asks: checks the
// node's standing, sends a newer verifier set, a changed trust bundle
// (sentBundle is the digest of the one sent last), pending tasks. A
// non-nil result ends the stream with it.
func (a *agentService) recheck(ctx context.Context, send func(*musterv1.AuthorityMessage) error, c Caller, check store.ChangeKind, sent *int64, sentBundle *string, delivered *sentTasks) error {
	if check&store.ChangeStanding != 0 {
		if err := a.s.enroll.Standing(ctx, c.Cert); err != nil && ctx.Err() == nil {
			a.streamLog(c).Info("agent stream closed", "reason", err)
			a.auditClose(ctx, c, auditText(err))
			return toStatus(ctx, a.s.log, err)
		}
	}
	if check&store.ChangeSigners != 0 {
		raw, version, err := a.s.signers.SignedVerifierSet(ctx, *sent)
		if err != nil && ctx.Err() == nil {
			return toStatus(ctx, a.s.log, err)
		}
		if raw != nil {
			if err := send(&musterv1.AuthorityMessage{Body: &musterv1.AuthorityMessage_VerifierSet{VerifierSet: raw}}); err != nil {
				return err
			}
			*sent = version
		}
	}
	if check&store.ChangeCA != 0 {
		if why := a.s.distrustedCaller(c.Cert); why != "" {
			// A root this authority no longer trusts signed the
			// stream's certificate: a rollback from init abandoned the
			// new root, or standby dropped the old one. Left open, the
			// stream would show the agent connected and holding the
			// bundle until its next renewal is refused.
			a.streamLog(c).Info("agent stream closed", "reason", why)
			a.auditClose(ctx, c, why)
			return status.Error(codes.Unauthenticated, why)
		}
		if b := a.s.trustBundle(); b.digest != *sentBundle {
			if err := send(&musterv1.AuthorityMessage{Body: &musterv1.AuthorityMessage_TrustBundle{TrustBundle: b.pb}}); err != nil {
				return err
			}
			*sentBundle = b.digest
		}
	}
	if check&store.ChangeTasks != 0 {
		if err := a.sendTasks(ctx, send, c.ID.Name, delivered); err != nil {
			if _, ok := err.(streamEnd); ok {
				return err
			}
			if ctx.Err() == nil {
				return toStatus(ctx, a.s.log, err)
			}
		}
	}
	return nil
}

// streamMetrics are the series of agent streams.
type streamMetrics struct {
	connected  prometheus.Gauge
	heartbeats prometheus.Counter
	refusals   *prometheus.CounterVec
	watchLost  prometheus.Counter
	copies     prometheus.Counter
}

func newStreamMetrics(reg prometheus.Registerer) (*streamMetrics, error) {
	m := &streamMetrics{
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "muster_connected_agents",
			Help: "Agent streams (AgentService.Connect) open on this replica.",
		}),
		heartbeats: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "muster_agent_heartbeats_total",
			Help: "Heartbeats received on agent streams by this replica.",
		}),
		watchLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "muster_change_watch_lost_total",
			Help: "Times this replica lost the store's change notifications and listened again; open streams re-check each time.",
		}),
		copies: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "muster_agent_stream_copies_suspected_total",
			Help: "Agent streams that took a node's stream back from another holder of the same identity, repeatedly, on this replica or another (each counted by the replica that took it back: sum over replicas): a copy of an agent's data directory (audited agent.stream_copy_suspected).",
		}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_task_verification_failures_total",
			Help: "Tasks agents refused, by the signer version the task named and the reason.",
		}, []string{"signer", "reason"}),
	}
	for _, c := range []prometheus.Collector{m.connected, m.heartbeats, m.refusals, m.watchLost, m.copies} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// sendTasks sends the node's pending tasks that this stream has not sent
// yet. A task sent by an earlier stream (the agent reconnected, here or
// on another replica) is sent again: its answer may have been lost with
// that stream. The agent does not run it again: it answers it when it
// ends, or with the answer it gave already (or, taken before the agent
// restarted, as replayed), and the first answer recorded stands.
func (a *agentService) sendTasks(ctx context.Context, send func(*musterv1.AuthorityMessage) error, node string, delivered *sentTasks) error {
	tasks, err := a.s.store.PendingTasks(ctx, node)
	if err != nil {
		return err
	}
	for _, t := range tasks {
		// Recorded before the send: the answer may come before Send
		// returns.
		if !delivered.add(t.ID, t.Type) {
			continue
		}
		if err := send(&musterv1.AuthorityMessage{Body: &musterv1.AuthorityMessage_Task{Task: t.Signed}}); err != nil {
			return err
		}
		if err := a.s.store.MarkTaskDelivered(ctx, t.ID, node); err != nil && !errors.Is(err, store.ErrConflict) {
			return err
		}
	}
	return nil
}

// taskResult records an agent's answer to a task of type taskType ("" if
// this stream did not send it), once, and audits it; a refusal with the
// way out.
func (s *Server) taskResult(ctx context.Context, node string, r *musterv1.TaskResult, taskType string) {
	state := r.GetState()
	switch state {
	case store.TaskOK, store.TaskRefused, store.TaskFailed:
	default:
		return
	}
	detail := r.GetReason()
	if d := r.GetDetail(); d != "" {
		detail = strings.TrimSpace(detail + " " + d)
	}
	if len(detail) > maxTaskDetail {
		detail = detail[:maxTaskDetail]
	}
	result := audit.ResultOK
	if state != store.TaskOK {
		result = audit.ResultDenied
	}
	reason := fmt.Sprintf("%s by signer %s: %s", state, r.GetSignerVersionId(), detail)
	if state == store.TaskRefused {
		current := ""
		if task.Reason(r.GetReason()) == task.ReasonUnknownSigner {
			current = s.currentSignerState(ctx, r.GetSignerVersionId())
		}
		if way := refusalWayOut(task.Reason(r.GetReason()), taskType, node, current); way != "" {
			reason += "; " + way
		}
	}
	// The answer is recorded with its task.result record, or not at all:
	// one the chain cannot take leaves the delivery unanswered, as if the
	// answer had not come.
	link, err := s.audit.Builder(audit.Event{Actor: "spiffe://" + s.info.TrustDomain + "/agent/" + node, Action: "task.result",
		Target: r.GetTaskId(), Result: result, Reason: reason})
	if err == nil {
		err = s.store.RecordTaskResult(ctx, r.GetTaskId(), node, state, detail, link.Build)
	}
	if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
		// A second answer (to a task sent again) or a task never
		// queued for this node: the first answer stands.
		return
	}
	if err != nil {
		if !s.outage.fail(err) {
			s.log.Error("task result not recorded: it is recorded with its task.result record or not at all, and the write failed", "err", err, "node", node, "task_id", r.GetTaskId())
		}
		return
	}
	s.audit.Appended(link)
	if state == store.TaskRefused {
		s.streams.refusals.WithLabelValues(signerLabel(r.GetSignerVersionId()), reasonLabel(r.GetReason())).Inc()
	}
}

// currentSignerState is the state of signer versionID in the store when
// it is active, staged, or in grace (before its grace_until), the signers
// the authority's current verifier set has an agent accept: one that
// refuses a task as signed by an unknown signer then does not hold the
// set; "" otherwise, or when the store cannot say.
func (s *Server) currentSignerState(ctx context.Context, versionID string) string {
	signers, _, err := s.store.ListSigners(ctx)
	if err != nil {
		return ""
	}
	now := s.now()
	for _, sg := range signers {
		if sg.VersionID != versionID {
			continue
		}
		switch {
		case sg.State == store.SignerActive || sg.State == store.SignerStaged:
			return sg.State
		case sg.State == store.SignerGrace && now.Before(sg.GraceUntil):
			// Past grace_until the agent rightly retired it, though the
			// store may not have yet.
			return sg.State
		}
	}
	return ""
}

// refusalWayOut is what the operator can do about an agent's refusal of a
// task of type taskType ("" if unknown) sent to node; current is the
// state of the task's signer in the store when it is active, staged or in
// grace ("" otherwise). A task queued for an agent that is offline waits for
// it, and its signer may be retired or revoked before the agent comes
// back: the agent then refuses it, rightly, and the task must be sent
// again, signed by the active signer. A rotate task needs nothing: agents
// learn signers from the verifier set. Neither helps an agent that does
// not accept a signer the store holds as active, staged or in grace: sent again,
// the task is signed by that signer again, and the verifier set that
// names it is one the agent has not taken (it missed it, or its set does
// not follow from the store's, restored from a backup).
func refusalWayOut(reason task.Reason, taskType, node, current string) string {
	again := "send it again with `muster task send`"
	if taskType != "" {
		again = fmt.Sprintf("send it again: `muster task send --type %s --node %s` (with its --param flags)", taskType, node)
	}
	switch {
	case reason == task.ReasonUnknownSigner && current != "":
		return fmt.Sprintf("that signer is %s in the authority's verifier set, which the agent does not hold (`muster agents show %s` shows the set it holds): "+
			"on the machine, `muster agent trust refresh --data ADIR` takes the current set or says why it cannot; "+
			"an agent whose set does not follow from the authority's (the store restored from a backup taken before the signer the agent holds as active was staged) must join again: "+
			"muster agent join --force --data ADIR --node %s with a joining URI from muster token create --node %s (docs/signer-lifecycle.md, \"Restoring the store\")",
			current, node, node, node)
	case taskType == task.TypeRotateSigningKey && (reason == task.ReasonUnknownSigner || reason == task.ReasonInvalidRotate || reason == task.ReasonExpired):
		return fmt.Sprintf("nothing to do: agents learn signers from the verifier set, which `muster agents show %s` shows the agent holds", node)
	case reason == task.ReasonUnknownSigner:
		return fmt.Sprintf("the agent accepts that signer no longer (retired or revoked since the task was sent) or not yet: %s, signed by the active signer; `muster agents show %s` shows the signers it accepts", again, node)
	case reason == task.ReasonBadSignature:
		return fmt.Sprintf("the agent holds another key under that signer version: `muster agents show %s` shows its verifier set; on the machine, `muster agent trust refresh` fetches the current one", node)
	case reason == task.ReasonExpired:
		return fmt.Sprintf("it reached the agent after its expiry (or the agent's clock is ahead): %s, with a longer --expires", again)
	case reason == task.ReasonNotYetValid:
		return "the agent's clock is behind the authority's: set it right (NTP), then " + again
	case reason == task.ReasonNoHandler:
		return "map the type to an executable in the agent's task-handlers.yaml (docs/task-handlers.md), then " + again
	}
	return ""
}

// maxTaskDetail bounds what of a task's output is kept.
const maxTaskDetail = 4096

// signerLabel keeps a metric label bounded: a version ID as signers have
// them, else "other".
func signerLabel(v string) string {
	if signer.ValidVersionID(v) != nil || len(v) > 16 {
		return "other"
	}
	return v
}

// reasonLabel keeps a metric label bounded: one of the agent's refusal
// reasons, else "other".
func reasonLabel(r string) string {
	switch task.Reason(r) {
	case task.ReasonMalformed, task.ReasonUnsigned, task.ReasonUnknownSigner, task.ReasonBadSignature, task.ReasonExpired,
		task.ReasonNotYetValid, task.ReasonReplayed, task.ReasonWindowFull, task.ReasonMistargeted, task.ReasonInvalidRotate, task.ReasonNoHandler:
		return r
	}
	return "other"
}

// heartbeatJSON is a heartbeat as the store keeps it and agents show
// prints it.
type heartbeatJSON struct {
	VerifierSetVersion int64             `json:"verifier_set_version"`
	AcceptedSigners    map[string]string `json:"accepted_signers"`
	IdentityNotAfter   time.Time         `json:"identity_not_after"`
	StaticVerifiers    int32             `json:"static_verifiers,omitempty"`
	LastRotateTask     string            `json:"last_rotate_task,omitempty"`
	// VerificationFailures counts refused tasks by signer version.
	VerificationFailures map[string]int64 `json:"verification_failures,omitempty"`
	// RecoveriesRemaining: a bound-keypair agent's budget, as it last heard.
	RecoveriesRemaining *int64 `json:"recoveries_remaining,omitempty"`
	// TrustBundle is the digest of the trust bundle the agent took last,
	// TrustBundleCerts the fingerprint of each certificate it holds.
	TrustBundle      string   `json:"trust_bundle,omitempty"`
	TrustBundleCerts []string `json:"trust_bundle_certs,omitempty"`
}

// recordHeartbeat keeps an agent's last heartbeat and when it was heard,
// in the row of its stream: store.ErrConflict if a newer stream of the
// agent holds the row, store.ErrNotFound if the node was deleted. The agent's figures are bounded before they are
// kept.
func (s *Server) recordHeartbeat(ctx context.Context, row store.AgentStream, hb *musterv1.Heartbeat) error {
	doc := heartbeatJSON{VerifierSetVersion: hb.GetVerifierSetVersion(), AcceptedSigners: map[string]string{},
		IdentityNotAfter: hb.GetIdentityNotAfter().AsTime().UTC(), StaticVerifiers: hb.GetStaticVerifiers()}
	if hb.RecoveriesRemaining != nil && hb.GetRecoveriesRemaining() >= 0 {
		n := hb.GetRecoveriesRemaining()
		doc.RecoveriesRemaining = &n
	}
	if uuid.Validate(hb.GetLastRotateTask()) == nil {
		doc.LastRotateTask = hb.GetLastRotateTask()
	}
	for v, n := range hb.GetVerificationFailures() {
		if v == "" || signer.ValidVersionID(v) == nil {
			if doc.VerificationFailures == nil {
				doc.VerificationFailures = map[string]int64{}
			}
			if len(doc.VerificationFailures) < signer.MaxSetKeys {
				doc.VerificationFailures[v] = n
			}
		}
	}
	if d := hb.GetTrustBundleDigest(); validDigest(d) {
		doc.TrustBundle = d
	}
	for _, f := range hb.GetTrustBundleCerts() {
		if validDigest(f) && len(doc.TrustBundleCerts) < trustbundle.MaxCerts {
			doc.TrustBundleCerts = append(doc.TrustBundleCerts, f)
		}
	}
	for v, st := range hb.GetAcceptedSigners() {
		if len(doc.AcceptedSigners) < signer.MaxSetKeys && signer.ValidVersionID(v) == nil && signer.State(st).Valid() {
			doc.AcceptedSigners[v] = st
		}
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return nil
	}
	row.Report = string(b)
	s.checkSetVersion(ctx, row.NodeID, hb.GetVerifierSetVersion(), hb.GetVerifierSet())
	if row.LastSeen, err = s.store.Now(ctx); err == nil {
		err = s.store.RecordAgentHeartbeat(ctx, row)
	}
	// ErrNotFound: the row went with its node (agents delete), whose
	// standing closes this stream within a second.
	if err != nil && !errors.Is(err, store.ErrConflict) && !errors.Is(err, store.ErrNotFound) && ctx.Err() == nil && !s.outage.fail(err) {
		s.log.Error("cannot record a heartbeat", "err", err, "node", row.NodeID)
	}
	return err
}

// streamToProto is what agents list and show say of a node's stream, by
// the store clock now: a row its replica left marked connected with no
// heartbeat since streamStaleAfter is a stream gone (streamLive), said
// as stale.
func streamToProto(a store.AgentStream, now time.Time) *musterv1.AgentStreamStatus {
	live := streamLive(&a, now)
	return &musterv1.AgentStreamStatus{Connected: live, Stale: a.Connected && !live, Replica: a.Replica, ConnectedAt: timestampOrNil(a.ConnectedAt),
		LastSeen: timestampOrNil(a.LastSeen), Heartbeat: a.Report}
}

// takeTries is how many times an opening stream reads the node's row and
// writes its own over it before it writes its own regardless: streams
// of one identity opening at once on several replicas (copies, each
// reconnecting as the other replaces it) each take the row in turn.
const takeTries = 5

// record writes the stream's row over the node's, on the store's clock,
// conditionally on the row it read: the replica whose write wins is the
// only one that sees this replacement, so the copy signal it carries
// (its holder and the node's last turn) counts each replacement once
// across replicas, and the suspicion is counted and audited by one
// replica (replaceOld).
func (st *agentStream) record() error {
	s := st.a.s
	st.row = store.AgentStream{NodeID: st.c.ID.Name, Replica: s.replicaName(), Connected: true, Holder: connectionID(st.c)}
	for try := 1; ; try++ {
		prev, err := s.store.GetAgentStream(st.ctx, st.row.NodeID)
		found := err == nil
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		now, err := s.store.Now(st.ctx)
		if err != nil {
			return err
		}
		turn, alternations := flapAfter(prev, found, st.row.Holder, now)
		st.row.StreamID, st.row.Turn = uuid.NewString(), turn
		st.row.ConnectedAt, st.row.LastSeen = now, now
		if try == takeTries {
			// Still racing: the stream opens all the same (the newest
			// holds the row), and this replacement counts for nothing.
			return s.store.RecordAgentStream(st.ctx, st.row)
		}
		err = s.store.TakeAgentStream(st.ctx, st.row, prev.StreamID)
		if errors.Is(err, store.ErrConflict) {
			continue
		}
		if err != nil {
			return err
		}
		if alternations > 0 {
			st.tookFrom, st.alternations = turn.From, alternations
		}
		return nil
	}
}
