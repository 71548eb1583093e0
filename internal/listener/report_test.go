package listener

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestRefusalsAreCountedAndLoggedOnceAMinute: every refusal is counted;
// the log has the first, then one line a minute per listener and kind
// saying how many since.
func TestRefusalsAreCountedAndLoggedOnceAMinute(t *testing.T) {
	var buf bytes.Buffer
	counted := map[string]int{}
	rs := NewRefusals(slog.New(slog.NewTextHandler(&buf, nil)), func(l string, r Refusal) { counted[l+"/"+string(r)]++ })
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rs.now = func() time.Time { return now }
	api, boot := rs.For("api", 100), rs.For("bootstrap", 100)
	for range 500 {
		api(RefusedTotal)
	}
	boot(RefusedPerSource)
	now = now.Add(refusalLogEvery)
	api(RefusedTotal)
	if counted["api/total"] != 501 || counted["bootstrap/per_source"] != 1 {
		t.Fatalf("counted %v", counted)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d log lines, want 3 (api's first, bootstrap's first, api's after a minute):\n%s", len(lines), buf.String())
	}
	if !strings.Contains(lines[0], "refused=1 ") || !strings.Contains(lines[0], "max_connections=100") ||
		!strings.Contains(lines[1], "listener=bootstrap") || !strings.Contains(lines[1], "max_per_source=50") ||
		!strings.Contains(lines[2], "refused=500 ") {
		t.Errorf("log:\n%s", buf.String())
	}
}
