package authority

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/muster-dev/muster/internal/store"
)

// downStore is a store whose database cannot be reached.
type downStore struct{ store.Store }

func (downStore) CountTokens(context.Context, time.Time) (store.TokenCounts, error) {
	return store.TokenCounts{}, fmt.Errorf("postgres: count tokens: %w: connection refused", store.ErrUnavailable)
}

// TestScrapeWithTheStoreDown: with the store unreachable, /metrics still
// answers 200 with every other series, muster_tokens left out and
// muster_store_up 0: the counters an operator alerts on during an outage
// stay scrapeable.
func TestScrapeWithTheStoreDown(t *testing.T) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(newTokenCollector(&Server{store: downStore{}})); err != nil {
		t.Fatal(err)
	}
	other := prometheus.NewCounter(prometheus.CounterOpts{Name: "muster_other_total", Help: "another series"})
	reg.MustRegister(other)
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body := rec.Body.String()
	if rec.Code != http.StatusOK {
		t.Fatalf("scrape with the store down: HTTP %d\n%s", rec.Code, body)
	}
	if !strings.Contains(body, "muster_other_total 0") || !strings.Contains(body, "muster_store_up 0") || strings.Contains(body, "muster_tokens{") {
		t.Errorf("scrape with the store down:\n%s", body)
	}
}

// TestScrapeBeginsTheOutage: a scrape whose token count finds the store
// unavailable reports it as a request does, as the outage's one log line,
// besides muster_store_up 0.
func TestScrapeBeginsTheOutage(t *testing.T) {
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, nil))
	s := &Server{store: downStore{}, log: log}
	s.outage = newStoreOutage(log, func(context.Context) error { return nil })
	reg := prometheus.NewRegistry()
	if err := reg.Register(newTokenCollector(s)); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "the store is unavailable") {
		t.Errorf("a scrape with the store unavailable logged:\n%s", logs.String())
	}
}
