package discoveryd

import (
	"context"
	"path"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/discovery"
)

// Results of the registrations and join reports metrics, besides the
// refusal reasons.
const (
	resultCreated   = "created"
	resultUpdated   = "updated"
	resultUnchanged = "unchanged"
	resultRecorded  = "recorded"
	resultDuplicate = "duplicate"
)

// metrics are discovery's Prometheus series, on a registry of its own.
// Labels hold bounded values only (methods, codes, reasons), never an
// authority ID, a node ID or an address.
type metrics struct {
	reg           *prometheus.Registry
	rpcs          *prometheus.CounterVec
	issued        prometheus.Counter
	denied        *prometheus.CounterVec
	registrations *prometheus.CounterVec
	reports       *prometheus.CounterVec
	rotations     prometheus.Counter
	auditRecords  *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		rpcs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_discovery_rpc_requests_total",
			Help: "RPCs handled, by method and gRPC status code.",
		}, []string{"method", "code"}),
		issued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "muster_discovery_tickets_issued_total",
			Help: "Referral tickets issued.",
		}),
		denied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_discovery_tickets_denied_total",
			Help: "Referral ticket requests refused, by reason: invalid_request, rate_limited, unknown_authority, source_not_allowed, node_id_not_allowed, quota_exhausted, error.",
		}, []string{"reason"}),
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_discovery_registrations_total",
			Help: "RegisterAuthority calls, by result: created, updated, unchanged, or the refusal (invalid, denied, not_allowed, root_not_allowed, root_not_linked, root_mismatch, stale_version, rate_limited, error).",
		}, []string{"result"}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_discovery_join_reports_total",
			Help: "ReportJoin calls, by result: recorded, duplicate (already counted), or the refusal (invalid, denied, unknown_authority, rate_limited, error).",
		}, []string{"result"}),
		rotations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "muster_discovery_ticket_key_rotations_total",
			Help: "Ticket key rotations this process made (scheduled ones; rotate-key runs are not counted here).",
		}),
		auditRecords: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_audit_records_total",
			Help: "Audit records written, by result.",
		}, []string{"result"}),
	}
	m.reg.MustRegister(m.rpcs, m.issued, m.denied, m.registrations, m.reports, m.rotations, m.auditRecords,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Every reason is exported from the start, at zero, so an alert on a
	// rate sees its first refusal.
	for _, r := range []string{discovery.DenyInvalid, discovery.DenyRateLimit, discovery.DenyUnknown, discovery.DenySource,
		discovery.DenyNodeID, discovery.DenyQuota, "error"} {
		m.denied.WithLabelValues(r)
	}
	return m
}

// unary counts every RPC by method and code.
func (m *metrics) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	m.rpcs.WithLabelValues(path.Base(info.FullMethod), status.Code(err).String()).Inc()
	return resp, err
}

func (m *metrics) onAudit(e audit.Event) { m.auditRecords.WithLabelValues(e.Result).Inc() }
