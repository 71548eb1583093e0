package authority

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/enroll"
)

// TestMetricsCachedChildren: the children the request path keeps count in
// the series WithLabelValues names, each call once, however many calls
// share a child; a series appears only once something counted in it.
func TestMetricsCachedChildren(t *testing.T) {
	m := newMetrics("test")
	start := time.Now()
	renew := "/muster.v1.CertificateService/RequestCertificate"
	for range 3 {
		m.observe(renew, start, nil)
	}
	m.observe(renew, start, status.Error(codes.PermissionDenied, "no"))
	m.observe("/muster.v1.BootstrapService/ExchangeJoinToken", start, nil)
	ok := &enroll.Issued{}
	m.join("token", start, ok, nil)
	m.join("token", start, ok, nil)
	m.join("psk", start, &enroll.Issued{Retry: true}, nil)
	m.renewal(start, ok, nil)
	m.renewal(start, nil, errors.New("store down"))
	m.onAudit(audit.Event{Result: "ok"})
	m.onAudit(audit.Event{Result: "ok"})
	m.onAudit(audit.Event{Result: "refused"})

	for _, c := range []struct {
		what string
		got  float64
		want float64
	}{
		{"rpc OK", value(t, m.rpcs.WithLabelValues("muster.v1.CertificateService", "RequestCertificate", "OK")), 3},
		{"rpc PermissionDenied", value(t, m.rpcs.WithLabelValues("muster.v1.CertificateService", "RequestCertificate", "PermissionDenied")), 1},
		{"rpc join OK", value(t, m.rpcs.WithLabelValues("muster.v1.BootstrapService", "ExchangeJoinToken", "OK")), 1},
		{"token ok", value(t, m.joins.WithLabelValues("token", "ok")), 2},
		{"psk retry", value(t, m.joins.WithLabelValues("psk", "retry")), 1},
		{"certificates join", value(t, m.certificates.WithLabelValues("join")), 2},
		{"renewals ok", value(t, m.renewals.WithLabelValues("ok")), 1},
		{"renewals unknown", value(t, m.renewals.WithLabelValues("unknown")), 1},
		{"certificates renewal", value(t, m.certificates.WithLabelValues("renewal")), 1},
		{"audit ok", value(t, m.auditRecords.WithLabelValues("ok")), 2},
		{"audit refused", value(t, m.auditRecords.WithLabelValues("refused")), 1},
	} {
		if c.got != c.want {
			t.Errorf("%s: %v, want %v", c.what, c.got, c.want)
		}
	}
	// Durations: one series per method, four and one observations.
	if n := seriesOf(m.rpcDuration); n != 2 {
		t.Errorf("muster_rpc_duration_seconds has %d series, want 2", n)
	}
	if n := seriesOf(m.issuance); n != 2 {
		t.Errorf("muster_issuance_duration_seconds has %d series, want 2 (join, renewal)", n)
	}
}

func value(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var d dto.Metric
	if err := c.Write(&d); err != nil {
		t.Fatal(err)
	}
	return d.GetCounter().GetValue()
}

func seriesOf(c prometheus.Collector) int {
	ch := make(chan prometheus.Metric, 64)
	c.Collect(ch)
	close(ch)
	return len(ch)
}
