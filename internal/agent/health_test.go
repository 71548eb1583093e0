package agent

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestHealthReady(t *testing.T) {
	joined := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	renewed := joined.Add(24 * time.Hour)
	tests := []struct {
		name  string
		st    *State
		now   time.Time
		ready bool
	}{
		{"no identity", nil, joined, false},
		{"fresh", &State{JoinedAt: joined, NotAfter: joined.Add(24 * time.Hour)}, joined.Add(time.Hour), true},
		{"past half-life, renewal pending", &State{JoinedAt: joined, NotAfter: joined.Add(24 * time.Hour)}, joined.Add(17 * time.Hour), true},
		{"last quarter: renewals failing", &State{JoinedAt: joined, NotAfter: joined.Add(24 * time.Hour)}, joined.Add(19 * time.Hour), false},
		{"expired", &State{JoinedAt: joined, NotAfter: joined.Add(24 * time.Hour)}, joined.Add(25 * time.Hour), false},
		{"renewed: window from the renewal", &State{JoinedAt: joined, LastRenewal: &renewed, NotAfter: renewed.Add(24 * time.Hour)}, renewed.Add(12 * time.Hour), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h health
			if tt.st != nil {
				h.observe(tt.st)
			}
			if err := h.ready(tt.now); (err == nil) != tt.ready {
				t.Errorf("ready(%s) = %v, want ready %v", tt.now, err, tt.ready)
			}
		})
	}
}

// TestMetricsHandlerProbes: /healthz answers from the start, /readyz only
// once an identity is loaded and valid.
func TestMetricsHandlerProbes(t *testing.T) {
	m := NewMetrics()
	get := func(path string) int {
		rec := httptest.NewRecorder()
		m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code
	}
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 503, "/metrics": 200, "/debug/pprof/": 404} {
		if got := get(path); got != want {
			t.Errorf("before an identity: GET %s = %d, want %d", path, got, want)
		}
	}
	now := time.Now()
	m.observe(&State{JoinedAt: now.Add(-time.Minute), NotAfter: now.Add(time.Hour)})
	if got := get("/readyz"); got != 200 {
		t.Errorf("with a fresh identity: GET /readyz = %d, want 200", got)
	}
}
