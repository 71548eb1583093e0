package e2e

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSecondAgentRunRefused: a second `agent run` on a data directory
// another one runs on (an operator's manual run beside the packaged unit,
// a DaemonSet on a node whose package agent uses the same directory) is
// refused at once, naming the directory; before, both ran and took the
// identity's stream from each other over and over. Once the first stops,
// the directory can be run again.
func TestSecondAgentRunRefused(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	tok := e.createToken(t)
	adir := filepath.Join(t.TempDir(), "agent")
	first, _ := startProcEnv(t, "agent", "agent started", []string{"MUSTER_JOIN_URI=" + tok.URI, "MUSTER_NODE_ID=once"},
		"agent", "run", "--data", adir, "--log-format", "json")
	r := muster(t, nil, "agent", "run", "--data", adir, "--log-format", "json")
	if r.code == 0 || !strings.Contains(r.stderr, "another muster agent run is running on "+adir) {
		t.Fatalf("a second agent run on %s: exit %d, %s", adir, r.code, r.stderr)
	}
	// The first stops once it has joined, so the next run has an identity
	// to load and needs no join inputs.
	for deadline := time.Now().Add(60 * time.Second); !strings.Contains(first.Logs(), `"identity loaded"`); {
		if time.Now().After(deadline) {
			t.Fatalf("the first agent loaded no identity within 60 s:\n%s", first.Logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
	first.stop(t)
	startProc(t, "agent again", "agent started", "agent", "run", "--data", adir, "--log-format", "json")
}
