package authority

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// tokenCollector reports join tokens by state at scrape time, from the
// store, so every replica reports the same numbers and nothing has to be
// kept in step.
type tokenCollector struct {
	s    *Server
	desc *prometheus.Desc
}

func newTokenCollector(s *Server) *tokenCollector {
	return &tokenCollector{s: s, desc: prometheus.NewDesc("muster_tokens",
		"Join tokens in the store, by state (active, expired, used_up).", []string{"state"}, nil)}
}

func (c *tokenCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *tokenCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	// Counted in the store: reading every token out took longer than the
	// scrape's 2 s at a million tokens (docs/performance.md, Scale).
	n, err := c.s.store.CountTokens(ctx, time.Now())
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
		return
	}
	for state, v := range map[string]int64{tokenActive: n.Active, tokenExpired: n.Expired, tokenUsedUp: n.UsedUp} {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(v), state)
	}
}
