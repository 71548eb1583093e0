package agent

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/muster-dev/muster/internal/httpserve"
	"github.com/muster-dev/muster/internal/signer"
)

// Metrics are the agent's Prometheus series. Labels hold only bounded
// values (results), never an identity or a secret. A nil *Metrics is
// valid and records nothing.
type Metrics struct {
	reg        *prometheus.Registry
	expiry     prometheus.Gauge
	renewals   *prometheus.CounterVec
	generation prometheus.Gauge
	health     health
	setVersion prometheus.Gauge
	setRefused prometheus.Counter
	streams    prometheus.Counter
	refused    prometheus.Counter
	// remaining is a bound-keypair agent's recovery budget left; its one
	// label is the agent's own token name, as on the authority.
	remaining *prometheus.GaugeVec
}

// NewMetrics returns the agent's series in their own registry.
func NewMetrics() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		expiry: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "muster_agent_identity_expiry_timestamp_seconds",
			Help: "NotAfter of the agent's current certificate, as a Unix time.",
		}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_agent_renewals_total",
			Help: "Renewal attempts, by result (ok, the gRPC code of a refusal or failure, or error for a local failure).",
		}, []string{"result"}),
		generation: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "muster_agent_generation",
			Help: "Generation (renewal count) of the agent's current instance.",
		}),
		remaining: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "muster_bound_keypair_recoveries_remaining",
			Help: "Recoveries the agent's standard-mode bound-keypair token has left, as of its last join, refresh or recovery.",
		}, []string{"token"}),
	}
	m.setVersion = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "muster_agent_verifier_set_version",
		Help: "Version of the task verifier set the agent holds (0: none yet).",
	})
	m.setRefused = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "muster_agent_verifier_set_refusals_total",
		Help: "Verifier sets the agent received and did not take (stale, malformed, or not signed by a signer it trusts as active).",
	})
	m.streams = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "muster_agent_stream_reconnects_total",
		Help: "Times the stream to the authority closed and the agent reconnects.",
	})
	m.refused = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "muster_agent_task_refusals_total",
		Help: "Tasks the agent refused (the authority counts them by signer version and reason).",
	})
	m.renewals.WithLabelValues("ok")
	m.reg.MustRegister(m.expiry, m.renewals, m.generation, m.remaining, m.setVersion, m.setRefused, m.streams, m.refused)
	return m
}

func (m *Metrics) observe(st *State) {
	if m == nil || st == nil {
		return
	}
	m.health.observe(st)
	m.expiry.Set(float64(st.NotAfter.Unix()))
	m.generation.Set(float64(st.Generation))
	if t, err := signer.NewTrust(st.VerifierSet, nil); err == nil && len(st.VerifierSet) > 0 {
		m.setVersion.Set(float64(t.Version()))
	}
	if st.BoundKeypair != "" && st.RecoveriesRemaining != nil && *st.RecoveriesRemaining >= 0 {
		m.remaining.WithLabelValues(st.BoundKeypair).Set(float64(*st.RecoveriesRemaining))
	}
}

// Registerer is where other parts of agent run (the Workload API) add
// their series; nil for a nil *Metrics.
func (m *Metrics) Registerer() prometheus.Registerer {
	if m == nil {
		return nil
	}
	return m.reg
}

func (m *Metrics) taskRefused() {
	if m != nil {
		m.refused.Inc()
	}
}

func (m *Metrics) streamClosed() {
	if m != nil {
		m.streams.Inc()
	}
}

// verifierSet records a verifier set taken (err nil, at version) or
// refused.
func (m *Metrics) verifierSet(version int64, err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.setRefused.Inc()
		return
	}
	m.setVersion.Set(float64(version))
}

func (m *Metrics) renewal(err error) {
	if m == nil {
		return
	}
	m.renewals.WithLabelValues(resultOf(err)).Inc()
}

// Handler serves /metrics, /healthz (the process answers) and /readyz
// (the identity is valid and not near its expiry; see health.ready).
func (m *Metrics) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := m.health.ready(time.Now()); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}

// Serve serves Handler on lis until ctx ends.
func (m *Metrics) Serve(ctx context.Context, lis net.Listener) error {
	return httpserve.Serve(ctx, lis, httpserve.NewServer(m.Handler(), httpserve.Default))
}
