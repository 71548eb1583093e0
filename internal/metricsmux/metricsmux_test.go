package metricsmux

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestHandler(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "muster_test_total", Help: "t"})
	reg.MustRegister(c)
	var down error
	h := New(reg, func(context.Context) error { return down })
	for _, tt := range []struct {
		path string
		down error
		code int
	}{
		{"/metrics", nil, 200}, {"/healthz", nil, 200}, {"/readyz", nil, 200},
		{"/readyz", errors.New("db gone"), 503}, {"/healthz", errors.New("db gone"), 200}, {"/nothing", nil, 404},
	} {
		down = tt.down
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tt.path, nil))
		if rec.Code != tt.code {
			t.Errorf("GET %s (store error %v) = %d, want %d", tt.path, tt.down, rec.Code, tt.code)
		}
	}
}

func TestReadyzPrintsNotReadyReason(t *testing.T) {
	h := New(prometheus.NewRegistry(), func(context.Context) error {
		return NotReady{Reason: "the CA intermediates cannot be read"}
	})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "not ready: the CA intermediates cannot be read") {
		t.Fatalf("GET /readyz = %d %q, want 503 naming the reason", rec.Code, rec.Body.String())
	}
}

// /readyz names a NotReady's reason (the key custody's token) and keeps any other
// error's text, which may be a store's, from the network.
func TestReadyzReason(t *testing.T) {
	var down error
	h := New(prometheus.NewRegistry(), func(context.Context) error { return down })
	for _, tt := range []struct {
		down error
		body string
	}{
		{errors.New("dial tcp 10.0.0.5:5432: secret detail"), "store unavailable\n"},
		{NotReady{Reason: "key custody: PKCS#11 token unavailable, re-opening"}, "not ready: key custody: PKCS#11 token unavailable, re-opening\n"},
	} {
		down = tt.down
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		if rec.Code != 503 || rec.Body.String() != tt.body {
			t.Errorf("%v: %d %q, want 503 %q", tt.down, rec.Code, rec.Body.String(), tt.body)
		}
	}
}
