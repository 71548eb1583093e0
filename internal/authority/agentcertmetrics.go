package authority

import (
	"cmp"
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/muster-dev/muster/internal/enroll"
	"github.com/muster-dev/muster/internal/store"
)

// agentCerts is muster_agent_certificates: the nodes (not deleted) by
// their latest certificate, valid, expiring (its last quarter of
// lifetime: the agent, which renews at half of it, has failed to renew
// for a quarter of it) or expired, as this replica last counted them in
// the store. A fleet going dark shows as expiring, then expired, before
// its agents fail. Every replica counts, at its own times, the same
// store by the store clock: each exports the same counts, give or take a
// count's period, so aggregate with max(), never sum(). Counted off the
// request path (run): the expiring and expired nodes by two index
// ranges, the valid ones by a count of every current node
// (store.AgentCertificateCounter); absent until the first count.
type agentCerts struct {
	s     *Server
	gauge *prometheus.GaugeVec
	every time.Duration
}

// The states of muster_agent_certificates.
const (
	agentCertValid    = "valid"
	agentCertExpiring = "expiring"
	agentCertExpired  = "expired"
)

// agentCertCountTimeout bounds one count: well within its period at the
// longest, and a store that takes longer is reported by muster_store_up.
const agentCertCountTimeout = 10 * time.Second

func newAgentCerts(s *Server, reg prometheus.Registerer) (*agentCerts, error) {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "muster_agent_certificates",
		Help: "Nodes (not deleted) by their latest certificate: valid, expiring (in the last quarter of its lifetime: not renewed at half of it) or expired, as this replica last counted them in the store (every replica counts the same store: aggregate with max).",
	}, []string{"state"})
	return &agentCerts{s: s, gauge: g, every: agentCertCountEvery(s.cfg)}, reg.Register(g)
}

// agentCertCountEvery is a sixteenth of the shortest agent certificate
// lifetime cfg issues, between a second and a minute: a node is seen
// expiring within a quarter of its last quarter, and a count a minute
// costs a replica one reading of the current nodes (the valid ones).
func agentCertCountEvery(cfg Config) time.Duration {
	shortest := min(cmp.Or(cfg.AgentCertTTL, enroll.DefaultAgentCertTTL), cmp.Or(cfg.BoundKeypairCertTTL, enroll.DefaultBoundKeypairCertTTL))
	return min(max(shortest/16, time.Second), time.Minute)
}

// run counts at once, then every period, until ctx ends.
func (a *agentCerts) run(ctx context.Context) {
	t := time.NewTicker(a.every)
	defer t.Stop()
	for {
		a.count(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// count reads the counts and exports them. A failed count keeps the last
// ones: the store's outage is logged once and shows as muster_store_up.
func (a *agentCerts) count(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, agentCertCountTimeout)
	n, err := a.s.store.CountAgentCertificates(cctx)
	cancel()
	if err != nil {
		if ctx.Err() == nil && !a.s.outage.fail(err) {
			a.s.log.Error("counting agent certificates by expiry failed; muster_agent_certificates keeps the last count", "err", err)
		}
		return
	}
	a.set(n)
}

func (a *agentCerts) set(n store.AgentCertificateCounts) {
	a.gauge.WithLabelValues(agentCertValid).Set(float64(n.Valid))
	a.gauge.WithLabelValues(agentCertExpiring).Set(float64(n.Expiring))
	a.gauge.WithLabelValues(agentCertExpired).Set(float64(n.Expired))
}
