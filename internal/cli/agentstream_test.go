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
		// Not only a killed replica: a store outage of over 2 minutes
		// makes every stream read so until its next heartbeat; the text
		// says so, and what to check, ending with the command to run
		// again.
		{"a stream its killed replica left marked connected", &streamJSON{Stale: true, Replica: "r1:7443", ConnectedAt: &opened, LastSeen: &seen,
			Heartbeat: []byte(`{"verifier_set_version":2}`)},
			[]string{"Stream: not connected, last seen 2026-11-27T12:01:00Z (on r1:7443, replica gone?",
				"or the store itself was out for over 2 minutes (then every stream reads so until its agent's next heartbeat, within 30s of the store's return)",
				"\nCheck that the replica runs and reaches the store (its /readyz on the metrics listener answers 200, muster_store_up is 1), then run muster agents show web-1 again in a minute",
				"Heartbeat: verifier set version 2"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var b strings.Builder
			printStream(&b, "web-1", c.s)
			for _, w := range c.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("agents show prints:\n%s\nwant %q", b.String(), w)
				}
			}
		})
	}
}

// TestStaleNote: agents list explains "replica gone?" under its table
// (on standard error) when a stream reads so: a killed replica, or a
// store outage of over 2 minutes, and what to check; nothing otherwise.
func TestStaleNote(t *testing.T) {
	if got := staleNote(0); got != "" {
		t.Errorf("staleNote(0) = %q, want nothing", got)
	}
	got := staleNote(3)
	for _, w := range []string{`note: 3 of these streams read "replica gone?"`, "the replica was killed or cut off from the store",
		"or the store itself was out for over 2 minutes", "check that each replica named runs and reaches the store",
		"then run muster agents list again in a minute: an agent still connected reads connected again\n"} {
		if !strings.Contains(got, w) {
			t.Errorf("staleNote(3) = %q, want %q", got, w)
		}
	}
}
