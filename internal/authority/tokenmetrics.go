package authority

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// tokenCollector reports join tokens by state at scrape time, from the
// store, so every replica reports the same numbers and nothing has to be
// kept in step. It also says whether the store answered: a store that
// does not drops the token series only, never the whole scrape (whose
// other series, the request counters above all, are what an operator
// watches during an outage).
type tokenCollector struct {
	s    *Server
	desc *prometheus.Desc
	up   *prometheus.Desc
}

func newTokenCollector(s *Server) *tokenCollector {
	return &tokenCollector{s: s, desc: prometheus.NewDesc("muster_tokens",
		"Join tokens in the store, by state (active, expired, used_up).", []string{"state"}, nil),
		up: prometheus.NewDesc("muster_store_up",
			"1 if the store answered this scrape's token count within 2 s, else 0 (and muster_tokens is left out).", nil, nil)}
}

func (c *tokenCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc; ch <- c.up }

func (c *tokenCollector) Collect(ch chan<- prometheus.Metric) {
	// Shorter than the store's own deadline (limits.store_timeout), as a
	// scrape must answer within Prometheus' scrape_timeout (10 s by
	// default): a store that does not answer within it is reported as
	// muster_store_up 0, and a store that answers unavailable begins the
	// outage, logged once as a request's failure does.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	// Counted in the store: reading every token out took longer than the
	// scrape's 2 s at a million tokens (docs/performance.md, Scale).
	n, err := c.s.store.CountTokens(ctx, time.Now())
	if err != nil {
		c.s.outage.fail(err)
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	for state, v := range map[string]int64{tokenActive: n.Active, tokenExpired: n.Expired, tokenUsedUp: n.UsedUp} {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(v), state)
	}
}
