package authority

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// caCollector exports the not-after of every CA intermediate in the trust
// bundle (prepared, active, retiring) as this replica uses them, so that
// nothing expires without a series an alert can watch
// (muster_ca_not_after_seconds - time() < …).
//
// muster_ca_rotation_blocked{role} is 1 while a role's successor is due
// within 60 days (or overdue), none is prepared and the root key is not
// in the data directory: an operator must run muster ca rotate ROLE
// --root-key FILE.
type caCollector struct {
	s       *Server
	desc    *prometheus.Desc
	blocked *prometheus.Desc
}

func newCACollector(s *Server) *caCollector {
	return &caCollector{s: s, desc: prometheus.NewDesc("muster_ca_not_after_seconds",
		"Expiry (Unix seconds) of each CA intermediate in the trust bundle, by role and serial (lower-case hex).",
		[]string{"role", "serial"}, nil),
		blocked: prometheus.NewDesc("muster_ca_rotation_blocked",
			"1 while the role's intermediate needs a successor within 60 days (or already) and none can be prepared because the root key is offline: run muster ca rotate ROLE --root-key FILE.",
			[]string{"role"}, nil)}
}

func (c *caCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.desc
	ch <- c.blocked
}

// Collect reads what the replica holds in memory; it asks the store
// nothing.
func (c *caCollector) Collect(ch chan<- prometheus.Metric) {
	for _, role := range caRoles {
		for _, cert := range c.s.ca.Accepted(role) {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(cert.NotAfter.Unix()),
				string(role), cert.SerialNumber.Text(16))
		}
	}
	if c.s.ca.CurrentIntermediates() == nil {
		return // the store was not read yet
	}
	warn := c.s.caWarnings(time.Now())
	for _, role := range caRoles {
		v := 0.0
		if warn[role] != "" {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.blocked, prometheus.GaugeValue, v, string(role))
	}
}
