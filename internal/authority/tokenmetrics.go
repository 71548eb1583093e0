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
	ts, err := c.s.store.ListTokens(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
		return
	}
	counts := map[string]float64{tokenActive: 0, tokenExpired: 0, tokenUsedUp: 0}
	now := time.Now()
	for _, t := range ts {
		counts[tokenState(t, now)]++
	}
	for state, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, n, state)
	}
}
