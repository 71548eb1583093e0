package authority

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// streamCheckEvery is how often an open agent stream re-checks the
// instance's standing in the store and looks for a new verifier set. The
// store is shared by every replica, so a lock, deletion or supersession
// made through any of them closes the stream within this period (the
// "equivalent" of LISTEN/NOTIFY that works on both backends; it costs one
// standing check per connected agent per period).
var streamCheckEvery = 500 * time.Millisecond

// Connect serves an agent's stream (see agent.proto).
func (a *agentService) Connect(stream musterv1.AgentService_ConnectServer) error {
	ctx := stream.Context()
	c := callerFrom(ctx)
	if err := a.s.enroll.Standing(ctx, c.Cert); err != nil {
		return toStatus(ctx, a.s.log, err)
	}
	// A stream never outlives the certificate it was opened with.
	ctx, cancel := context.WithDeadline(ctx, c.Cert.NotAfter)
	defer cancel()
	a.s.streams.connected.Inc()
	defer a.s.streams.connected.Dec()
	log := a.s.log.With("node", c.ID.Name, "correlation_id", c.CorrelationID)
	log.Info("agent stream opened")

	recvErr := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			if hb := m.GetHeartbeat(); hb != nil {
				a.s.streams.heartbeats.Inc()
				log.Debug("heartbeat", "verifier_set_version", hb.GetVerifierSetVersion(), "accepted_signers", hb.GetAcceptedSigners(),
					"identity_not_after", hb.GetIdentityNotAfter().AsTime(), "static_verifiers", hb.GetStaticVerifiers())
			}
		}
	}()

	var sent int64 = -1 // the version of the last set sent
	t := time.NewTicker(streamCheckEvery)
	defer t.Stop()
	for {
		raw, version, err := a.s.signers.SignedVerifierSet(ctx, sent)
		if err != nil && ctx.Err() == nil {
			return toStatus(ctx, a.s.log, err)
		}
		if raw != nil {
			if err := stream.Send(&musterv1.AuthorityMessage{Body: &musterv1.AuthorityMessage_VerifierSet{VerifierSet: raw}}); err != nil {
				return err
			}
			sent = version
		}
		select {
		case err := <-recvErr:
			log.Info("agent stream closed by the agent", "err", err)
			return nil
		case <-ctx.Done():
			if errors.Is(context.Cause(ctx), context.DeadlineExceeded) && stream.Context().Err() == nil {
				log.Info("agent stream closed: certificate expired")
				return status.Error(codes.Unauthenticated, "the certificate this stream was opened with has expired; reconnect with the renewed one")
			}
			return nil
		case <-t.C:
		}
		if err := a.s.enroll.Standing(ctx, c.Cert); err != nil {
			if ctx.Err() != nil {
				continue
			}
			log.Info("agent stream closed", "reason", err)
			return toStatus(ctx, a.s.log, err)
		}
	}
}

// streamMetrics are the series of agent streams.
type streamMetrics struct {
	connected  prometheus.Gauge
	heartbeats prometheus.Counter
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
	}
	for _, c := range []prometheus.Collector{m.connected, m.heartbeats} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
