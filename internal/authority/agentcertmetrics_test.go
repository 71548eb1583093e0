package authority

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/sqlite"
)

// failingCount is a store whose certificate count fails once fail is set.
type failingCount struct {
	store.Store
	fail *bool
}

func (f failingCount) CountAgentCertificates(ctx context.Context) (store.AgentCertificateCounts, error) {
	if *f.fail {
		return store.AgentCertificateCounts{}, errors.New("disk on fire")
	}
	return f.Store.CountAgentCertificates(ctx)
}

// TestAgentCertificatesGauge: muster_agent_certificates exports the
// store's counts of nodes by their certificates' expiry, absent before
// the first count; a count that fails keeps the last one and is logged.
func TestAgentCertificatesGauge(t *testing.T) {
	ctx := t.Context()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	now, err := st.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.InsertToken(ctx, store.Token{ID: "t", JoinMethod: store.JoinMethodToken, Ciphertext: []byte("c"), Nonce: []byte("n"),
		CreatedBy: "admin", CreatedAt: now}, setupLink); err != nil {
		t.Fatal(err)
	}
	for i, life := range []struct{ from, to time.Duration }{
		{-time.Minute, time.Hour}, {-time.Minute, 2 * time.Hour}, {-50 * time.Minute, 10 * time.Minute}, {-2 * time.Hour, -time.Hour},
	} {
		id := string(rune('a' + i))
		if _, err := st.CommitJoin(ctx, store.Join{TokenID: "t", NodeID: "node-" + id,
			Instance: store.Instance{ID: "inst-" + id, JoinMethod: store.JoinMethodToken, CreatedAt: now, LastChainPEM: []byte("chain")},
			Certificate: store.Certificate{Serial: "0" + id, PublicKey: []byte("key " + id),
				NotBefore: now.Add(life.from), NotAfter: now.Add(life.to), IssuedAt: now.Add(life.from)}}); err != nil {
			t.Fatal(err)
		}
	}
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, nil))
	fail := false
	s := &Server{store: failingCount{st, &fail}, log: log}
	s.outage = newStoreOutage(log, func(context.Context) error { return nil })
	reg := prometheus.NewRegistry()
	a, err := newAgentCerts(s, reg)
	if err != nil {
		t.Fatal(err)
	}
	scrape := func() string {
		rec := httptest.NewRecorder()
		promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		return rec.Body.String()
	}
	if body := scrape(); strings.Contains(body, "muster_agent_certificates{") {
		t.Fatalf("counts exported before the first count:\n%s", body)
	}
	want := []string{`muster_agent_certificates{state="valid"} 2`, `muster_agent_certificates{state="expiring"} 1`, `muster_agent_certificates{state="expired"} 1`}
	a.count(ctx)
	body := scrape()
	for _, w := range want {
		if !strings.Contains(body, w) {
			t.Errorf("scrape does not say %s:\n%s", w, body)
		}
	}
	fail = true
	a.count(ctx)
	if got := scrape(); got != body {
		t.Errorf("a failed count changed the counts:\n%s\nwant:\n%s", got, body)
	}
	if !strings.Contains(logs.String(), "counting agent certificates by expiry failed") || !strings.Contains(logs.String(), "disk on fire") {
		t.Errorf("a failed count logged:\n%s", logs.String())
	}
}

// TestAgentCertCountEvery: a sixteenth of the shortest lifetime issued,
// between a second and a minute.
func TestAgentCertCountEvery(t *testing.T) {
	for _, tt := range []struct {
		agent, bound, want time.Duration
	}{
		{0, 0, time.Minute}, // defaults: 24 h and 1 h
		{8 * time.Second, 0, time.Second},
		{32 * time.Minute, 0, time.Minute}, // 2 min, capped
		{0, 16 * time.Minute, time.Minute},
		{0, 8 * time.Minute, 30 * time.Second},
		{time.Hour, 0, time.Minute},
		{16 * time.Second, 8 * time.Minute, time.Second},
	} {
		cfg := Config{AgentCertTTL: tt.agent, BoundKeypairCertTTL: tt.bound}
		if got := agentCertCountEvery(cfg); got != tt.want {
			t.Errorf("agent %s, bound %s: every %s, want %s", tt.agent, tt.bound, got, tt.want)
		}
	}
}
