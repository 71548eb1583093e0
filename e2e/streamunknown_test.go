package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestStreamCertificateUnknown: through the built binary, an agent that
// joined after the backup its authority's store was restored from is
// refused on its stream (certificate_unknown) as soon as it connects, and
// agent run stops at once, naming the join over its identity, instead of
// waiting for its renewal at half the certificate's lifetime; the
// authority's audit record of the refused stream names the join too.
func TestStreamCertificateUnknown(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t, "--agent-cert-ttl", "24h")
	addr := e.auth.addr

	// The backup, taken with the authority stopped, before the join.
	backup := t.TempDir()
	e.auth.stop(t)
	copyStore(t, e.dir, backup)
	e.auth = startAuthority(t, e.dir, "--listen", addr, "--agent-cert-ttl", "24h")

	adir := filepath.Join(t.TempDir(), "agent")
	mustRun(t, "agent", "join", "--data", adir, "--node", "late", e.createToken(t, "--node", "late").URI)

	// The restore, as docs/high-availability.md says.
	e.auth.stop(t)
	copyStore(t, backup, e.dir)
	evidence := t.TempDir()
	for _, f := range []string{"audit-head", "audit-checkpoint.json"} {
		if err := os.Rename(filepath.Join(e.dir, f), filepath.Join(evidence, f)); err != nil {
			t.Fatal(err)
		}
	}
	e.auth = startAuthority(t, e.dir, "--listen", addr, "--agent-cert-ttl", "24h")

	r := muster(t, nil, "agent", "run", "--data", adir, "--log-format", "json")
	rejoin := "muster agent join --force --data " + adir + " --node late with a joining URI from muster token create --node late"
	if r.code <= 0 || !strings.Contains(r.stderr, "certificate_unknown") || !strings.Contains(r.stderr, rejoin) {
		t.Fatalf("agent run after the restore: exit %d, want it to stop naming %q\n%s", r.code, rejoin, r.stderr)
	}
	if !strings.Contains(r.stderr, "refused for the node's standing") {
		t.Errorf("agent run did not log the stream's refusal:\n%s", r.stderr)
	}
	audit := mustRun(t, "audit", "list", "--data", e.dir, "--action", "agent.stream_close")
	audit += mustRun(t, "audit", "list", "--data", e.dir, "--action", "api.access")
	if !strings.Contains(audit, "certificate unknown to this authority") || !strings.Contains(audit, "muster agent join --force --data ADIR --node late") {
		t.Errorf("the refused stream's audit record names no join:\n%s", audit)
	}
}
