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
	"github.com/muster-dev/muster/internal/signer"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/task"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// streamCheckEvery is how often open agent streams re-check the store when
// the store cannot announce changes (changeWatcher). Both backends can, and
// then a stream re-checks only when woken by a change that concerns it.
var streamCheckEvery = 500 * time.Millisecond

// Connect serves an agent's stream (see agent.proto).
func (a *agentService) Connect(stream musterv1.AgentService_ConnectServer) error {
	ctx := stream.Context()
	c := callerFrom(ctx)
	// Subscribed before the first check, so a change committed after that
	// check wakes the stream.
	wake, unsubscribe := a.s.hub.subscribe(c.ID.Name)
	defer unsubscribe()
	var err error
	// Store work is done apart (stack.go): this goroutine and the receive
	// loop wait for the stream's whole life and keep only small stacks.
	if apart(func() { err = a.s.enroll.Standing(ctx, c.Cert) }); err != nil {
		return toStatus(ctx, a.s.log, err)
	}
	// A stream never outlives the certificate it was opened with.
	ctx, cancel := context.WithDeadline(ctx, c.Cert.NotAfter)
	defer cancel()
	a.s.streams.connected.Inc()
	defer a.s.streams.connected.Dec()
	a.streamLog(c).Info("agent stream opened")
	row := store.AgentStream{NodeID: c.ID.Name, Replica: a.s.advertise(), Connected: true}
	apart(func() {
		if row.ConnectedAt, err = a.s.store.Now(ctx); err == nil {
			row.LastSeen = row.ConnectedAt
			err = a.s.store.RecordAgentStream(ctx, row)
		}
	})
	if err != nil {
		return toStatus(ctx, a.s.log, err)
	}
	// A heartbeat being recorded as the stream ends must not mark the
	// stream connected again after its end is recorded: the two writes are
	// serialised, and no heartbeat is recorded once the end is.
	var (
		recordMu sync.Mutex
		ended    bool
	)
	defer apart(func() {
		recordMu.Lock()
		defer recordMu.Unlock()
		ended = true
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		now, err := a.s.store.Now(rctx)
		if err == nil {
			err = a.s.store.CloseAgentStream(rctx, row.NodeID, row.ConnectedAt, now)
		}
		if err != nil {
			a.streamLog(c).Error("cannot record the stream's end", "err", err)
		}
	})

	recvErr := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			if r := m.GetResult(); r != nil {
				apart(func() { a.s.taskResult(ctx, c.ID.Name, r) })
			}
			if hb := m.GetHeartbeat(); hb != nil {
				a.s.streams.heartbeats.Inc()
				apart(func() {
					recordMu.Lock()
					defer recordMu.Unlock()
					if !ended {
						a.s.recordHeartbeat(ctx, row, hb)
					}
				})
			}
		}
	}()

	var sent int64 = -1 // the version of the last set sent
	delivered := map[string]bool{}
	// A stream re-checks only what a change it is woken by concerns: its
	// standing (a lock, deletion, supersession), the verifier set (a signer
	// step) or its tasks; an idle stream asks the store nothing.
	check := store.ChangeSigners | store.ChangeTasks // standing was checked above
	for {
		var end error
		if apart(func() { end = a.recheck(ctx, stream, c, check, &sent, delivered) }); end != nil {
			return end
		}
		select {
		case err := <-recvErr:
			a.streamLog(c).Info("agent stream closed by the agent", "err", err)
			if _, ok := status.FromError(err); ok && !errors.Is(err, io.EOF) {
				// A message that was refused (one that does not parse, or
				// is too large) ends the stream with its refusal, not OK.
				return err
			}
			return nil
		case <-ctx.Done():
			if errors.Is(context.Cause(ctx), context.DeadlineExceeded) && stream.Context().Err() == nil {
				a.streamLog(c).Info("agent stream closed: certificate expired")
				return status.Error(codes.Unauthenticated, "the certificate this stream was opened with has expired; reconnect with the renewed one")
			}
			return nil
		case <-wake.c:
			check = wake.take()
		}
	}
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
// node's standing, sends a newer verifier set, sends pending tasks. A
// non-nil result ends the stream with it.
func (a *agentService) recheck(ctx context.Context, stream musterv1.AgentService_ConnectServer, c Caller, check store.ChangeKind, sent *int64, delivered map[string]bool) error {
	if check&store.ChangeStanding != 0 {
		if err := a.s.enroll.Standing(ctx, c.Cert); err != nil && ctx.Err() == nil {
			a.streamLog(c).Info("agent stream closed", "reason", err)
			return toStatus(ctx, a.s.log, err)
		}
	}
	if check&store.ChangeSigners != 0 {
		raw, version, err := a.s.signers.SignedVerifierSet(ctx, *sent)
		if err != nil && ctx.Err() == nil {
			return toStatus(ctx, a.s.log, err)
		}
		if raw != nil {
			if err := stream.Send(&musterv1.AuthorityMessage{Body: &musterv1.AuthorityMessage_VerifierSet{VerifierSet: raw}}); err != nil {
				return err
			}
			*sent = version
		}
	}
	if check&store.ChangeTasks != 0 {
		if err := a.sendTasks(ctx, stream, c.ID.Name, delivered); err != nil && ctx.Err() == nil {
			return toStatus(ctx, a.s.log, err)
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
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_task_verification_failures_total",
			Help: "Tasks agents refused, by the signer version the task named and the reason.",
		}, []string{"signer", "reason"}),
	}
	for _, c := range []prometheus.Collector{m.connected, m.heartbeats, m.refusals, m.watchLost} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// sendTasks sends the node's pending tasks that this stream has not sent
// yet. A task sent by another replica's stream (the agent reconnected) is
// sent again: the agent's replay window answers it as replayed, and the
// first answer stands.
func (a *agentService) sendTasks(ctx context.Context, stream musterv1.AgentService_ConnectServer, node string, delivered map[string]bool) error {
	tasks, err := a.s.store.PendingTasks(ctx, node)
	if err != nil {
		return err
	}
	for _, t := range tasks {
		if delivered[t.ID] {
			continue
		}
		if err := stream.Send(&musterv1.AuthorityMessage{Body: &musterv1.AuthorityMessage_Task{Task: t.Signed}}); err != nil {
			return err
		}
		delivered[t.ID] = true
		if err := a.s.store.MarkTaskDelivered(ctx, t.ID, node); err != nil && !errors.Is(err, store.ErrConflict) {
			return err
		}
	}
	return nil
}

// taskResult records an agent's answer to a task, once, and audits it.
func (s *Server) taskResult(ctx context.Context, node string, r *musterv1.TaskResult) {
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
	err := s.store.RecordTaskResult(ctx, r.GetTaskId(), node, state, detail)
	if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
		// A second answer (a redelivery refused as replayed) or a task
		// never queued for this node: the first answer stands.
		return
	}
	if err != nil {
		s.log.Error("cannot record a task result", "err", err, "node", node)
		return
	}
	if state == store.TaskRefused {
		s.streams.refusals.WithLabelValues(signerLabel(r.GetSignerVersionId()), reasonLabel(r.GetReason())).Inc()
	}
	result := audit.ResultOK
	if state != store.TaskOK {
		result = audit.ResultDenied
	}
	s.audit.Record(context.WithoutCancel(ctx), audit.Event{Actor: "spiffe://" + s.info.TrustDomain + "/agent/" + node, Action: "task.result",
		Target: r.GetTaskId(), Result: result, Reason: fmt.Sprintf("%s by signer %s: %s", state, r.GetSignerVersionId(), detail)})
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
}

// recordHeartbeat keeps an agent's last heartbeat and when it was heard.
// The agent's figures are bounded before they are kept.
func (s *Server) recordHeartbeat(ctx context.Context, row store.AgentStream, hb *musterv1.Heartbeat) {
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
	for v, st := range hb.GetAcceptedSigners() {
		if len(doc.AcceptedSigners) < signer.MaxSetKeys && signer.ValidVersionID(v) == nil && signer.State(st).Valid() {
			doc.AcceptedSigners[v] = st
		}
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return
	}
	row.Report = string(b)
	if row.LastSeen, err = s.store.Now(ctx); err == nil {
		err = s.store.RecordAgentStream(ctx, row)
	}
	if err != nil && ctx.Err() == nil {
		s.log.Error("cannot record a heartbeat", "err", err, "node", row.NodeID)
	}
}

// streamStatus is what agents list and show say of a node's stream.
func (s *Server) streamStatus(ctx context.Context, node string) (*musterv1.AgentStreamStatus, error) {
	a, err := s.store.GetAgentStream(ctx, node)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	return &musterv1.AgentStreamStatus{Connected: a.Connected, Replica: a.Replica, ConnectedAt: timestampOrNil(a.ConnectedAt),
		LastSeen: timestampOrNil(a.LastSeen), Heartbeat: a.Report}, nil
}
