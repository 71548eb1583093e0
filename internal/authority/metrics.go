package authority

import (
	"context"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/audit"
)

// metrics are the authority's Prometheus series. Labels hold only bounded
// values (method names, codes, results), never an identity or a secret.
type metrics struct {
	reg          *prometheus.Registry
	rpcs         *prometheus.CounterVec
	rpcDuration  *prometheus.HistogramVec
	auditRecords *prometheus.CounterVec
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
	}
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "muster_build_info",
		Help: "Build of the running muster; always 1.",
	}, []string{"version", "go_version"})
	build.WithLabelValues(version, runtime.Version()).Set(1)
	m.reg.MustRegister(m.rpcs, m.rpcDuration, m.auditRecords, build,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) onAudit(e audit.Event) { m.auditRecords.WithLabelValues(e.Result).Inc() }

func (m *metrics) observe(fullMethod string, start time.Time, err error) {
	service, method := serviceOf(fullMethod)
	m.rpcs.WithLabelValues(service, method, status.Code(err).String()).Inc()
	m.rpcDuration.WithLabelValues(service, method).Observe(time.Since(start).Seconds())
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
