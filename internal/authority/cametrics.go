package authority

import (
	"github.com/prometheus/client_golang/prometheus"
)

// caCollector exports the not-after of every CA intermediate in the trust
// bundle (prepared, active, retiring) as this replica uses them, so that
// nothing expires without a series an alert can watch
// (muster_ca_not_after_seconds - time() < …).
type caCollector struct {
	s    *Server
	desc *prometheus.Desc
}

func newCACollector(s *Server) *caCollector {
	return &caCollector{s: s, desc: prometheus.NewDesc("muster_ca_not_after_seconds",
		"Expiry (Unix seconds) of each CA intermediate in the trust bundle, by role and serial (lower-case hex).",
		[]string{"role", "serial"}, nil)}
}

func (c *caCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect reads what the replica holds in memory; it asks the store
// nothing.
func (c *caCollector) Collect(ch chan<- prometheus.Metric) {
	for _, role := range caRoles {
		for _, cert := range c.s.ca.Accepted(role) {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(cert.NotAfter.Unix()),
				string(role), cert.SerialNumber.Text(16))
		}
	}
}
