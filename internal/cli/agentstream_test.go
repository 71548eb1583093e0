package cli

import (
	"strings"
	"testing"
	"time"
)

// TestPrintStreamHeartbeat: agents show says what a stream reported, and
// that a stream has not reported yet, with its opening as the last
// contact, rather than leaving the heartbeat out as if the agent never
// reported.
func TestPrintStreamHeartbeat(t *testing.T) {
	opened := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	seen := opened.Add(time.Minute)
	for _, c := range []struct {
		name string
		s    *streamJSON
		want []string
	}{
		{"a new stream", &streamJSON{Connected: true, Replica: "r1:7443", ConnectedAt: &opened, LastSeen: &opened},
			[]string{"Stream: connected to r1:7443 since 2026-11-27T12:00:00Z", "Heartbeat: none yet on this stream (opened 2026-11-27T12:00:00Z"}},
		{"a stream that reported", &streamJSON{Connected: true, Replica: "r1:7443", ConnectedAt: &opened, LastSeen: &seen,
			Heartbeat: []byte(`{"verifier_set_version":2,"accepted_signers":{"v1":"active"}}`)},
			[]string{"last seen 2026-11-27T12:01:00Z", "Heartbeat: verifier set version 2, accepts v1 (active)"}},
		{"an ended stream that never reported", &streamJSON{Replica: "r1:7443", ConnectedAt: &opened, LastSeen: &opened},
			[]string{"Stream: disconnected, last seen 2026-11-27T12:00:00Z", "Heartbeat: none on that stream"}},
		{"a stream its killed replica left marked connected", &streamJSON{Stale: true, Replica: "r1:7443", ConnectedAt: &opened, LastSeen: &seen,
			Heartbeat: []byte(`{"verifier_set_version":2}`)},
			[]string{"Stream: not connected, last seen 2026-11-27T12:01:00Z (on r1:7443, replica gone?", "Heartbeat: verifier set version 2"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var b strings.Builder
			printStream(&b, c.s)
			for _, w := range c.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("agents show prints:\n%s\nwant %q", b.String(), w)
				}
			}
		})
	}
}
