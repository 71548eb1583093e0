package agent

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/muster-dev/muster/internal/identity"
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
)

// keepStream holds the agent's stream to the authority open until ctx
// ends, reconnecting with jittered exponential backoff. It takes each
// verifier set the authority sends, and sends heartbeats.
func (a *Agent) keepStream(ctx context.Context) {
	delay := streamBackoffMin
	for {
		start := a.now()
		err := a.streamOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if a.now().Sub(start) >= streamStable {
			delay = streamBackoffMin
		}
		wait := rand.N(delay + 1)
		a.log.Warn("stream to the authority closed; reconnecting", "retry_in", wait.Round(time.Millisecond).String(), "err", err)
		a.metrics.streamClosed()
		if !sleep(ctx, wait) {
			return
		}
		delay = min(delay*2, streamBackoffMax)
	}
}

// streamOnce opens one stream with the current certificate and serves it
// until it ends.
func (a *Agent) streamOnce(ctx context.Context) error {
	st, id, err := a.loadLocked(ctx)
	if err != nil {
		return err
	}
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
	defer cancel()
	stream, err := musterv1.NewAgentServiceClient(conn).Connect(ctx)
	if err != nil {
		return err
	}
	a.log.Info("stream to the authority open", "authority", a.address(st))

	// A gRPC stream takes one sender at a time.
	var sendMu sync.Mutex
	send := func(m *musterv1.AgentMessage) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(m)
	}
	sendErr := make(chan error, 1)
	go func() {
		t := time.NewTicker(heartbeatEvery)
		defer t.Stop()
		for {
			if err := send(&musterv1.AgentMessage{Body: &musterv1.AgentMessage_Heartbeat{Heartbeat: a.heartbeat(ctx)}}); err != nil {
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
	}()
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
			// Tasks run in turn, each after the previous answered: a
			// renewal or a handler may take a while, and the stream
			// keeps the order the authority queued them in.
			if err := send(&musterv1.AgentMessage{Body: &musterv1.AgentMessage_Result{Result: a.handleTask(ctx, raw)}}); err != nil {
				return err
			}
			// What the task changed (a staged signer, a refusal count)
			// is reported at once, not at the next heartbeat.
			if err := send(&musterv1.AgentMessage{Body: &musterv1.AgentMessage_Heartbeat{Heartbeat: a.heartbeat(ctx)}}); err != nil {
				return err
			}
		}
		if raw := m.GetVerifierSet(); raw != nil {
			if err := a.streamedVerifierSet(ctx, raw, conn); err != nil {
				a.log.Warn("could not record a streamed verifier set", "err", err)
			}
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

// heartbeat is the agent's report of itself.
func (a *Agent) heartbeat(ctx context.Context) *musterv1.Heartbeat {
	hb := &musterv1.Heartbeat{}
	st, id, err := a.loadLocked(ctx)
	if err != nil {
		return hb
	}
	hb.IdentityNotAfter = timestamppb.New(id.Leaf().NotAfter)
	hb.LastRotateTask, hb.VerificationFailures = st.LastRotateTask, a.failureCounts()
	if n := st.RecoveriesRemaining; n != nil && *n >= 0 {
		hb.RecoveriesRemaining = n
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
