package authority

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/enroll"
	"github.com/muster-dev/muster/internal/errinfo"
)

// metrics are the authority's Prometheus series. Labels hold only bounded
// values (method names, codes, results), never an identity or a secret.
type metrics struct {
	// outage counts the calls answered storeUnavailable (nil: none).
	outage       *storeOutage
	reg          *prometheus.Registry
	rpcs         *prometheus.CounterVec
	rpcDuration  *prometheus.HistogramVec
	auditRecords *prometheus.CounterVec
	joins        *prometheus.CounterVec
	renewals     *prometheus.CounterVec
	issuance     *prometheus.HistogramVec
	certificates *prometheus.CounterVec
	psks         *prometheus.CounterVec
	tickets      *prometheus.CounterVec
	discovery    *prometheus.CounterVec
	// discoveryPinMismatch is 1 while discovery's certificate does not
	// match the pinned fingerprint (set by the leader).
	discoveryPinMismatch prometheus.Gauge
	// reportsPending is set by the replica that delivers join reports.
	reportsPending prometheus.Gauge
	// streamSendsWaiting counts sends to agents waiting over slowSend.
	streamSendsWaiting prometheus.Gauge

	// The children of the vectors above that requests use, kept once
	// made: WithLabelValues hashes and checks its labels on every call,
	// which showed in the authority's profile of joins and renewals.
	rpcsBy        seriesCache[rpcKey, prometheus.Counter]
	rpcDurationBy seriesCache[string, prometheus.Observer]
	auditBy       seriesCache[string, prometheus.Counter]
	joinsBy       seriesCache[[2]string, prometheus.Counter]
	renewalsBy    seriesCache[string, prometheus.Counter]
	issuanceBy    seriesCache[string, prometheus.Observer]
	certificateBy seriesCache[string, prometheus.Counter]
}

// rpcKey names one muster_rpc_requests_total series.
type rpcKey struct {
	fullMethod string
	code       codes.Code
}

// seriesCache holds the child of a metric vector for each label key met so
// far, made by newChild on first use: a series appears on the first call
// that counts in it, as with WithLabelValues. Keys are the vectors'
// bounded label values, so the map stays small.
type seriesCache[K comparable, V any] struct {
	newChild func(K) V
	mu       sync.RWMutex
	m        map[K]V
}

func (c *seriesCache[K, V]) get(k K) V {
	c.mu.RLock()
	v, ok := c.m[k]
	c.mu.RUnlock()
	if ok {
		return v
	}
	v = c.newChild(k) // WithLabelValues returns the same child to racing callers
	c.mu.Lock()
	if c.m == nil {
		c.m = make(map[K]V)
	}
	c.m[k] = v
	c.mu.Unlock()
	return v
}

func newMetrics(version string) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		rpcs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_rpc_requests_total",
			Help: "RPCs handled, by service, method and gRPC status code.",
		}, []string{"service", "method", "code"}),
		rpcDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "muster_rpc_duration_seconds",
			Help:    "Time to handle an RPC, by service and method.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"service", "method"}),
		auditRecords: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_audit_records_total",
			Help: "Audit records written, by result.",
		}, []string{"result"}),
		joins: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_joins_total",
			Help: "Join attempts, by join method and result: the gRPC code as in muster_rpc_requests_total, or Retry for a repeated request answered with the certificate already issued.",
		}, []string{"method", "result"}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_renewals_total",
			Help: "Renewal attempts, by result: the gRPC code as in muster_rpc_requests_total, or Retry for a repeated request answered with the certificate already issued.",
		}, []string{"result"}),
		issuance: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "muster_issuance_duration_seconds",
			Help:    "Time to answer a join or renewal that issued a certificate, by kind (join, renewal).",
			Buckets: []float64{.0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1},
		}, []string{"kind"}),
		certificates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_certificates_issued_total",
			Help: "Agent certificates issued, by kind (join, renewal).",
		}, []string{"kind"}),
		psks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_psk_validations_total",
			Help: "Bootstrap PSKs presented, by result: active, grace (matched the PSK in its grace period) or invalid (missing or matching none).",
		}, []string{"result"}),
		tickets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_referral_tickets_total",
			Help: "Referral tickets checked at PSK bootstraps, by result: ok, missing, invalid, expired or replayed.",
		}, []string{"result"}),
		discovery: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_discovery_calls_total",
			Help: "Calls to the discovery service, by operation (register, report) and gRPC status code.",
		}, []string{"operation", "code"}),
		streamSendsWaiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "muster_agent_stream_sends_waiting",
			Help: "Sends to agent streams waiting longer than 1 s now: their agents do not read (each is closed at the 10 s send deadline).",
		}),
		discoveryPinMismatch: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "muster_discovery_pin_mismatch",
			Help: "Whether discovery's certificate fails to match the pinned fingerprint (discovery.fingerprint), so the authority is not registered there, as the replica leading background jobs found at its last attempt: 1 then, 0 otherwise (and on the other replicas).",
		}),
		reportsPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "muster_discovery_reports_pending",
			Help: "Join reports stored and not yet delivered to discovery, as the replica leading background jobs counted them after its last delivery pass (0 on the others).",
		}),
	}
	m.rpcsBy.newChild = func(k rpcKey) prometheus.Counter {
		service, method := serviceOf(k.fullMethod)
		return m.rpcs.WithLabelValues(service, method, k.code.String())
	}
	m.rpcDurationBy.newChild = func(fullMethod string) prometheus.Observer {
		return m.rpcDuration.WithLabelValues(serviceOf(fullMethod))
	}
	m.auditBy.newChild = func(r string) prometheus.Counter { return m.auditRecords.WithLabelValues(r) }
	m.joinsBy.newChild = func(k [2]string) prometheus.Counter { return m.joins.WithLabelValues(k[0], k[1]) }
	m.renewalsBy.newChild = func(r string) prometheus.Counter { return m.renewals.WithLabelValues(r) }
	m.issuanceBy.newChild = func(kind string) prometheus.Observer { return m.issuance.WithLabelValues(kind) }
	m.certificateBy.newChild = func(kind string) prometheus.Counter { return m.certificates.WithLabelValues(kind) }
	for _, r := range []string{enroll.PSKResultActive, enroll.PSKResultGrace, enroll.PSKResultInvalid} {
		m.psks.WithLabelValues(r)
	}
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "muster_build_info",
		Help: "Build of the running muster; always 1.",
	}, []string{"version", "go_version"})
	build.WithLabelValues(version, runtime.Version()).Set(1)
	m.reg.MustRegister(m.rpcs, m.rpcDuration, m.auditRecords, m.joins, m.renewals, m.issuance, m.certificates, m.psks, m.tickets, m.discovery, m.discoveryPinMismatch, m.reportsPending, m.streamSendsWaiting, build,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) onAudit(e audit.Event) { m.auditBy.get(e.Result).Inc() }

func (m *metrics) observe(fullMethod string, start time.Time, err error) {
	m.rpcsBy.get(rpcKey{fullMethod, status.Code(err)}).Inc()
	m.rpcDurationBy.get(fullMethod).Observe(time.Since(start).Seconds())
	m.outage.observe(err)
}

func (m *metrics) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	m.observe(info.FullMethod, start, err)
	return resp, err
}

func (m *metrics) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	start := time.Now()
	err := handler(srv, ss)
	m.observe(info.FullMethod, start, err)
	return err
}

// result is the label of an enrollment outcome, in lower snake case like
// every result label of the authority and the agent (the code labels of
// the RPC metrics keep gRPC's names, as other gRPC servers export them).
func result(iss *enroll.Issued, err error) string {
	switch {
	case err != nil:
		var ref *enroll.Refusal
		if errors.As(err, &ref) {
			return errinfo.CodeWord(refusalCodes[ref.Kind])
		}
		return errinfo.CodeWord(status.Code(err))
	case iss.Retry:
		return "retry"
	default:
		return errinfo.CodeWord(codes.OK)
	}
}

func (m *metrics) join(method string, start time.Time, iss *enroll.Issued, err error) {
	m.joinsBy.get([2]string{method, result(iss, err)}).Inc()
	if err == nil && !iss.Retry {
		m.issuanceBy.get("join").Observe(time.Since(start).Seconds())
		m.certificateBy.get("join").Inc()
	}
}

func (m *metrics) renewal(start time.Time, iss *enroll.Issued, err error) {
	m.renewalsBy.get(result(iss, err)).Inc()
	if err == nil && !iss.Retry {
		m.issuanceBy.get("renewal").Observe(time.Since(start).Seconds())
		m.certificateBy.get("renewal").Inc()
	}
}

func (m *metrics) pskValidation(result string) { m.psks.WithLabelValues(result).Inc() }

func (m *metrics) ticket(result string) { m.tickets.WithLabelValues(result).Inc() }

func (m *metrics) discoveryCall(op string, err error) {
	m.discovery.WithLabelValues(op, status.Code(err).String()).Inc()
}
