package authority

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/crl"
	"github.com/muster-dev/muster/internal/store"
)

// maxLeafTTL is the longest lifetime of a node's certificate (the cap on
// --agent-cert-ttl): a deleted node whose last certificate is older holds
// none unexpired.
const maxLeafTTL = 7 * 24 * time.Hour

// crlRoles are the intermediates that sign leaves, so publish a list.
var crlRoles = []ca.Role{ca.RoleBootstrap, ca.RoleServer, ca.RoleAgent, ca.RoleAdmin}

// crlIssuers are the issuing intermediates as the CRL publisher sees them:
// the active one of each role, every retiring one (whose leaves may still
// be valid) and every prepared one (whose list, empty, is served before it
// signs its first leaf), from the store once it was read, the data
// directory's before.
func crlIssuers(h *ca.Hierarchy) func() []crl.Issuer {
	return func() []crl.Issuer {
		var out []crl.Issuer
		live := h.CurrentIntermediates()
		for _, role := range crlRoles {
			if i := h.Issuer(role); i != nil {
				out = append(out, crl.Issuer{Role: string(role), Cert: i.Cert, Signer: i.Key})
			}
			if live == nil {
				continue
			}
			for _, i := range live.Retiring[role] {
				out = append(out, crl.Issuer{Role: string(role), Cert: i.Cert, Signer: i.Key})
			}
			for _, i := range live.Prepared[role] {
				out = append(out, crl.Issuer{Role: string(role), Cert: i.Cert, Signer: i.Key})
			}
		}
		return out
	}
}

// setupCRL makes the publisher when lists are asked for (--crl-listen or
// --crl-url). With --crl-url, every leaf names its issuer's list in its
// CRL Distribution Points: the intermediates read from the store carry
// them (intermediates.load), and only they sign leaves, since the store
// is read before the authority listens.
func (s *Server) setupCRL(cfg Config) error {
	if cfg.CRLListen == "" && cfg.CRLURL == "" {
		return nil
	}
	s.crl = crl.New(crl.Config{Store: cfg.Store, Issuers: crlIssuers(cfg.CA), Validity: cfg.CRLValidity, MaxLeafTTL: maxLeafTTL, Log: cfg.Log})
	return s.metrics.reg.Register(crlCollector{s.crl})
}

// pokeCRL asks for new lists if a change may alter them: a lock, a node's
// deletion (the store's ChangeStanding), or an unlock served here.
func (s *Server) pokeCRL(c store.Change) {
	if s.crl != nil && c.Kind&store.ChangeStanding != 0 {
		s.crl.Poke()
	}
}

// crlHandler serves the stored lists, unauthenticated, at
// /crl/ROLE-SERIAL.crl. Each list is read from the store at most once a
// second, so every replica serves the newest one without a flood of
// requests reaching the database.
func (s *Server) crlHandler() http.Handler {
	type cached struct {
		c    store.CRL
		read time.Time
	}
	var (
		mu    sync.Mutex
		cache = map[string]cached{}
	)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		name, ok := crl.NameFromPath(r.URL.Path)
		if !ok {
			http.NotFound(w, r)
			return
		}
		mu.Lock()
		hit, ok := cache[name]
		mu.Unlock()
		if !ok || time.Since(hit.read) > time.Second {
			// The store's deadline, not a shorter one of its own: a
			// hung database is then its outage, logged once.
			ctx, cancel := context.WithTimeout(r.Context(), storeJobTimeout)
			c, err := s.crl.Get(ctx, name)
			cancel()
			switch {
			case errors.Is(err, crl.ErrUnknownIssuer):
				http.NotFound(w, r)
				return
			case errors.Is(err, store.ErrNotFound):
				http.Error(w, "the first list of this issuer is not signed yet", http.StatusServiceUnavailable)
				return
			case err != nil:
				if !s.outage.fail(err) {
					s.log.Error("reading a certificate revocation list", "issuer", name, "err", err)
				}
				http.Error(w, "store unavailable", http.StatusServiceUnavailable)
				return
			}
			hit = cached{c: c, read: time.Now()}
			mu.Lock()
			cache[name] = hit
			mu.Unlock()
		}
		h := w.Header()
		h.Set("Content-Type", "application/pkix-crl")
		h.Set("Content-Length", strconv.Itoa(len(hit.c.DER)))
		// A relying party may keep it until nextUpdate; a cache in
		// between should ask again, so a lock reaches it within seconds.
		h.Set("Cache-Control", "no-cache")
		h.Set("Last-Modified", hit.c.ThisUpdate.UTC().Format(http.TimeFormat))
		if r.Method == http.MethodGet {
			w.Write(hit.c.DER)
		}
	})
}

// crlCollector exports the age and size of each list at scrape time.
type crlCollector struct{ p *crl.Publisher }

var (
	crlAgeDesc = prometheus.NewDesc("muster_crl_age_seconds",
		"Seconds since the certificate revocation list of an issuing intermediate was signed (it is signed again at half its validity, and within seconds of a lock or deletion).",
		[]string{"role", "serial"}, nil)
	crlNextUpdateDesc = prometheus.NewDesc("muster_crl_next_update_seconds",
		"When the certificate revocation list of an issuing intermediate expires (its nextUpdate, Unix seconds), as this replica last read or signed it: relying parties refuse the issuer's leaves after it. Signed anew at half its validity, so it stays at least half a validity ahead unless signing fails, or the intermediate's key is lost (it is never signed again).",
		[]string{"role", "serial"}, nil)
	crlEntriesDesc = prometheus.NewDesc("muster_crl_entries",
		"Certificates listed in the certificate revocation list of an issuing intermediate.",
		[]string{"role", "serial"}, nil)
)

func (c crlCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- crlAgeDesc
	ch <- crlNextUpdateDesc
	ch <- crlEntriesDesc
}

func (c crlCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	for _, st := range c.p.Statuses() {
		serial := st.Issuer.Cert.SerialNumber.Text(16)
		ch <- prometheus.MustNewConstMetric(crlAgeDesc, prometheus.GaugeValue, now.Sub(st.ThisUpdate).Seconds(), st.Issuer.Role, serial)
		ch <- prometheus.MustNewConstMetric(crlNextUpdateDesc, prometheus.GaugeValue, float64(st.NextUpdate.Unix()), st.Issuer.Role, serial)
		ch <- prometheus.MustNewConstMetric(crlEntriesDesc, prometheus.GaugeValue, float64(st.Entries), st.Issuer.Role, serial)
	}
}
