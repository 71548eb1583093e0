package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/agent"
)

// TestBoundKeypairThroughDiscovery: bound-keypair joins through a real
// discovery, by joining URI (binding with the registration secret) and by
// flags (a key bound statically). The agent looks the authority up, proves
// its endpoint by the pinned root and authority SAN, and runs the exchange
// there with no referral ticket; agent run then refreshes at the
// authority's address. A listing whose root is not the pinned one gets
// nothing: the registration secret is still unused afterwards.
func TestBoundKeypairThroughDiscovery(t *testing.T) {
	t.Parallel()
	e := newReferralEnv(t, "", "--agent-cert-ttl", "6s")
	if msg := mustFail(t, "bot", "add", "runner", "--discovery", "no-port", "--data", e.dir); !strings.Contains(msg, "--discovery") {
		t.Fatalf("bot add with a bad discovery address: %s", msg)
	}
	out := mustRun(t, "bot", "add", "runner", "--discovery", e.disc.addr, "--discovery-fingerprint", e.disc.fingerprint, "--data", e.dir, "-o", "json")
	reg := botOf(t, out)
	secret := reg.BoundKeypair.RegistrationSecret
	if secret == "" {
		t.Fatalf("bot add printed no registration secret: %+v", reg)
	}
	var printed struct {
		DiscoveryURI string `json:"discovery_uri"`
	}
	if err := json.Unmarshal([]byte(out), &printed); err != nil {
		t.Fatal(err)
	}
	uri := func(fingerprint string) string {
		return "muster+bound-keypair://runner:" + secret + "@" + e.disc.addr + "?fingerprint=" + fingerprint +
			"&authority_id=" + e.authorityID + "&discovery_fingerprint=" + e.disc.fingerprint
	}

	// Another root pinned: refused before the secret or a signature leaves.
	adir := filepath.Join(t.TempDir(), "runner")
	r := muster(t, []string{"MUSTER_JOIN_URI=" + uri("sha256:"+strings.Repeat("0", 64))}, "agent", "join", "--data", adir)
	wantJoinFailure(t, r, "", "nothing was sent")
	assertNoAgentCerts(t, adir)

	// The discovery form bot add printed is the one DESIGN.md gives.
	if printed.DiscoveryURI != uri(e.fingerprint) {
		t.Fatalf("bot add --discovery printed %q, want %q", printed.DiscoveryURI, uri(e.fingerprint))
	}
	r = muster(t, []string{"MUSTER_JOIN_URI=" + printed.DiscoveryURI}, "agent", "join", "--data", adir)
	if r.code != 0 {
		t.Fatalf("bound-keypair join through discovery by URI: exit %d\n%s\nauthority:\n%s", r.code, r.stderr, e.auth.Logs())
	}
	st := agentState(t, adir)
	if st.JoinMethod != agent.JoinMethodBoundKeypair || st.Authority != e.auth.addr || st.AuthorityID != e.authorityID || st.JoinState == "" {
		t.Fatalf("state.json after the join through discovery: %+v", st)
	}
	cfg, _ := os.ReadFile(filepath.Join(adir, "agent.yaml"))
	if strings.Contains(string(cfg), secret) || !strings.Contains(string(cfg), "discovery: "+e.disc.addr) {
		t.Errorf("agent.yaml after the join:\n%s", cfg)
	}
	if got := botOf(t, mustRun(t, "token", "get", "runner", "--data", e.dir, "-o", "json")); got.BoundKeypair.BoundKeyFingerprint == "" {
		t.Errorf("the key was not bound: %+v", got)
	}

	// agent run refreshes at the authority's address: same instance.
	p, _ := startProc(t, "agent", "agent started", "agent", "run", "--data", adir, "--log-format", "json")
	waitLog(t, p, "refresh done", 1, 20*time.Second)
	p.stop(t)
	if now := agentState(t, adir); now.InstanceID != st.InstanceID || now.Serial == st.Serial || now.Authority != e.auth.addr {
		t.Fatalf("after the refresh: %+v (joined %+v)", now, st)
	}

	// The flag form, with a key bound statically.
	bdir := filepath.Join(t.TempDir(), "builder")
	keyFile := filepath.Join(t.TempDir(), "builder.pub")
	if err := os.WriteFile(keyFile, []byte(mustRun(t, "keypair", "create", "--data", bdir)), 0o600); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "bot", "add", "builder", "--public-key", keyFile, "--data", e.dir)
	mustRun(t, "agent", "join", "--data", bdir, "--bound-keypair", "builder", "--discovery", e.disc.addr,
		"--discovery-fingerprint", e.disc.fingerprint, "--authority-id", e.authorityID, "--ca-fingerprint", e.fingerprint)
	if st := agentState(t, bdir); st.JoinMethod != agent.JoinMethodBoundKeypair || st.Authority != e.auth.addr {
		t.Fatalf("state.json after the flag join through discovery: %+v", st)
	}
	mustRun(t, "agent", "renew", "--data", bdir)
}
