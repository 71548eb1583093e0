package authority

import (
	"strings"
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
//
// muster_ca_key_available{role,serial} is, for each active intermediate
// whose key is in a token, 1 while the last probe (every 10 s) found the
// key's object there and 0 when it did not: the replica cannot sign that
// role's certificates and is not ready (docs/hsm.md "A lost token").
type caCollector struct {
	s       *Server
	desc    *prometheus.Desc
	blocked *prometheus.Desc
	keyOK   *prometheus.Desc
}

func newCACollector(s *Server) *caCollector {
	return &caCollector{s: s, desc: prometheus.NewDesc("muster_ca_not_after_seconds",
		"Expiry (Unix seconds) of each CA intermediate in the trust bundle, by role and serial (lower-case hex).",
		[]string{"role", "serial"}, nil),
		blocked: prometheus.NewDesc("muster_ca_rotation_blocked",
			"1 while the role's intermediate needs a successor within 60 days (or already) and none can be prepared because the root key is offline: run muster ca rotate ROLE --root-key FILE.",
			[]string{"role"}, nil),
		keyOK: prometheus.NewDesc("muster_ca_key_available",
			"1 while the active intermediate's key object is in the PKCS#11 token (looked up every 10 s), 0 when it is missing: the replica cannot sign and is not ready.",
			[]string{"role", "serial"}, nil)}
}

func (c *caCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.desc
	ch <- c.blocked
	ch <- c.keyOK
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
	if c.s.inter != nil {
		c.s.inter.keyOK.Range(func(id, v any) bool {
			role, serial, _ := strings.Cut(id.(string), "/")
			ch <- prometheus.MustNewConstMetric(c.keyOK, prometheus.GaugeValue, v.(float64), role, serial)
			return true
		})
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
