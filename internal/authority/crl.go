package authority

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"

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
// be valid, also under the old root of a rotation in standby, for relying
// parties that still trust it) and every prepared one (whose list, empty, is served before it
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
			for _, i := range live.DistrustedRetiring[role] {
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
	s.crlCache = newCRLCache(s.crl.Get, s.crlReadFailed)
	if err := s.metrics.reg.Register(s.crlCache.servedCopy); err != nil {
		return err
	}
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
// /crl/ROLE-SERIAL.crl, through crlCache.
func (s *Server) crlHandler() http.Handler {
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
		l, err := s.crlCache.get(r.Context(), name)
		switch {
		case errors.Is(err, crl.ErrUnknownIssuer):
			http.NotFound(w, r)
			return
		case errors.Is(err, store.ErrNotFound):
			http.Error(w, "the first list of this issuer is not signed yet", http.StatusServiceUnavailable)
			return
		case err != nil && r.Context().Err() != nil:
			return // the client is gone
		case err != nil:
			http.Error(w, "certificate revocation list unavailable: the authority cannot read its store and holds no copy of this list before its nextUpdate; "+
				"the operator should check the authority's store (the authority's log, /readyz and muster_store_up on its metrics listener)", http.StatusServiceUnavailable)
			return
		}
		h := w.Header()
		h.Set("Content-Type", "application/pkix-crl")
		h.Set("Content-Length", strconv.Itoa(len(l.DER)))
		// A relying party may keep it until nextUpdate; a cache in
		// between should ask again, so a lock reaches it within seconds.
		h.Set("Cache-Control", "no-cache")
		h.Set("Last-Modified", l.ThisUpdate.UTC().Format(http.TimeFormat))
		if r.Method == http.MethodGet {
			w.Write(l.DER)
		}
	})
}

const (
	// crlReadEvery: each list is read from the store at most once a
	// second per replica, so every replica serves the newest one without
	// a flood of fetches reaching the database.
	crlReadEvery = time.Second
	// crlCopyWait is how long a fetch waits for the store when this
	// replica holds a copy of the list before its nextUpdate: past it
	// the copy is served, and the read goes on for the fetches after.
	crlCopyWait = 2 * time.Second
)

// crlCache holds the lists as last read from the store. Concurrent
// fetches of a list share one read; while the store cannot be read (down,
// or slower than crlCopyWait) the copy held is served as long as it is
// before its nextUpdate, since a relying party may keep it that long
// anyway. Before, each fetch after the second read the store itself (a
// flood of them was a flood of reads of a database already struggling),
// and a store outage was a 503 for every fetch, so relying parties that
// fail closed refused every agent.
type crlCache struct {
	// read is the store's list (crl.Publisher.Get).
	read func(ctx context.Context, name string) (store.CRL, error)
	// failed is told of a read that failed for the store, and whether a
	// copy is served meanwhile.
	failed func(name string, err error, copy *store.CRL)
	// servedCopy counts fetches answered with the copy.
	servedCopy prometheus.Counter
	// now is time.Now; tests set it.
	now func() time.Time

	mu    sync.Mutex
	lists map[string]cachedCRL
	reads singleflight.Group
	// reading holds when each read under way began: a fetch that finds
	// one under way for crlCopyWait already gets the copy at once.
	reading map[string]time.Time
}

type cachedCRL struct {
	// c is the list last read, if held.
	c    store.CRL
	held bool
	// tried is when the store was last read for it, err that read's
	// failure.
	tried time.Time
	err   error
}

func newCRLCache(read func(context.Context, string) (store.CRL, error), failed func(string, error, *store.CRL)) *crlCache {
	return &crlCache{read: read, failed: failed, lists: map[string]cachedCRL{}, reading: map[string]time.Time{}, now: time.Now,
		servedCopy: prometheus.NewCounter(prometheus.CounterOpts{Name: "muster_crl_served_copy_total",
			Help: "Fetches of a certificate revocation list answered with this replica's copy, before its nextUpdate, because the store could not be read in time."})}
}

// get returns the list name: the one read within crlReadEvery, else a
// new read's, shared with every fetch waiting for it. When the store
// fails or is slow, it returns the copy held if that is before its
// nextUpdate, and the store's error otherwise.
func (c *crlCache) get(ctx context.Context, name string) (store.CRL, error) {
	c.mu.Lock()
	hit := c.lists[name]
	since, reading := c.reading[name]
	c.mu.Unlock()
	now := c.now()
	valid := hit.held && now.Before(hit.c.NextUpdate)
	if valid && reading && now.Sub(since) >= crlCopyWait {
		// The store has not answered a read for crlCopyWait: another
		// wait would only hold this fetch (and its connection) as long,
		// and fail a relying party whose own timeout is shorter.
		c.servedCopy.Inc()
		return hit.c, nil
	}
	if !hit.tried.IsZero() && now.Sub(hit.tried) < crlReadEvery {
		switch {
		case hit.err == nil:
			return hit.c, nil
		case valid: // the store failed within the second
			c.servedCopy.Inc()
			return hit.c, nil
		default:
			return store.CRL{}, hit.err
		}
	}
	reads := c.reads.DoChan(name, func() (any, error) { return c.readStore(name) })
	var wait <-chan time.Time
	if valid {
		t := time.NewTimer(crlCopyWait)
		defer t.Stop()
		wait = t.C
	}
	select {
	case r := <-reads:
		if r.Err == nil {
			return r.Val.(store.CRL), nil
		}
		if !valid || errors.Is(r.Err, crl.ErrUnknownIssuer) || errors.Is(r.Err, store.ErrNotFound) {
			return store.CRL{}, r.Err
		}
	case <-wait:
	case <-ctx.Done():
		return store.CRL{}, ctx.Err()
	}
	c.servedCopy.Inc()
	return hit.c, nil
}

// readStore reads the list name from the store, with the store's
// deadline rather than the fetch's: the read is shared, and must not end
// with the client that started it. A hung database is then its outage,
// logged once.
func (c *crlCache) readStore(name string) (any, error) {
	c.mu.Lock()
	c.reading[name] = c.now()
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), storeJobTimeout)
	l, err := c.read(ctx, name)
	cancel()
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.reading, name)
	hit := c.lists[name]
	switch {
	case err == nil:
		c.lists[name] = cachedCRL{c: l, held: true, tried: now}
		return l, nil
	case errors.Is(err, crl.ErrUnknownIssuer):
		delete(c.lists, name) // retired: its list is served no more
	case errors.Is(err, store.ErrNotFound):
		// Not signed yet (the first pass of a new intermediate is under
		// way): the answer is kept crlReadEvery like any other, so the
		// fetches meanwhile get it without each reading the store.
		hit.tried, hit.err = now, err
		c.lists[name] = hit
	default:
		// Said once as the reads of this list start failing, and again
		// after one succeeded (or found none signed yet).
		if hit.tried.IsZero() || hit.err == nil || errors.Is(hit.err, store.ErrNotFound) {
			var copy *store.CRL
			if hit.held && now.Before(hit.c.NextUpdate) {
				copy = &hit.c
			}
			c.failed(name, err, copy)
		}
		hit.tried, hit.err = now, err
		c.lists[name] = hit
	}
	return nil, err
}

// crlReadFailed logs a list's read that failed for the store, once per
// outage (storeOutage), and the copy served meanwhile.
func (s *Server) crlReadFailed(name string, err error, copy *store.CRL) {
	if !s.outage.fail(err) {
		s.log.Error("reading a certificate revocation list", "issuer", name, "err", err)
	}
	if copy != nil {
		s.log.Warn("serving this replica's copy of a certificate revocation list until the store answers (muster_crl_served_copy_total counts the fetches)", "issuer", name,
			"next_update", copy.NextUpdate.UTC().Format(time.RFC3339))
	} else {
		s.log.Error("no certificate revocation list to serve: the store could not be read and this replica holds no copy before its nextUpdate; fetches get 503 until the store answers",
			"issuer", name)
	}
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
