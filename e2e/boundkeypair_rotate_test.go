package e2e

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/agent"
	"github.com/muster-dev/muster/internal/boundkeypair"
)

// TestBoundKeypairRotation: through the built binary, token apply sets
// rotate_after in the past; the running agent's next refresh is asked for
// a new key, proves it with a second challenge, and swaps keys/bound.key
// for it; token get shows the new fingerprint and last_rotated_at; the
// next refresh proves the new key and is not asked to rotate again. The
// join also delivers the verifier set. An agent whose rotation reply was
// lost (old bound.key, new key pending, the authority bound the new one)
// falls back to the pending key.
func TestBoundKeypairRotation(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t, "--agent-cert-ttl", "6s")
	adir := filepath.Join(t.TempDir(), "agent")
	pubLine := strings.TrimSpace(mustRun(t, "keypair", "create", "--data", adir))
	keyFile := filepath.Join(t.TempDir(), "bot.pub")
	if err := os.WriteFile(keyFile, []byte(pubLine+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "bot", "add", "rotor", "--public-key", keyFile, "--data", e.dir)
	mustRun(t, "agent", "join", "--data", adir, "--bound-keypair", "rotor", "--authority", e.auth.addr, "--ca-fingerprint", e.fingerprint)
	type status struct {
		BoundKeyFingerprint string     `json:"bound_key_fingerprint"`
		LastRotatedAt       *time.Time `json:"last_rotated_at"`
		RecoveryCount       int64      `json:"recovery_count"`
	}
	get := func() status {
		var s struct {
			BoundKeypair status `json:"bound_keypair"`
		}
		if err := json.Unmarshal([]byte(mustRun(t, "token", "get", "rotor", "--data", e.dir, "-o", "json")), &s); err != nil {
			t.Fatal(err)
		}
		return s.BoundKeypair
	}
	// The bound join brought the verifier set, as a token join does.
	var ast map[string]any
	if err := json.Unmarshal([]byte(mustRun(t, "agent", "status", "--data", adir, "-o", "json")), &ast); err != nil {
		t.Fatal(err)
	}
	if ast["verifier_set_version"] != float64(1) {
		t.Fatalf("verifier set version after the bound join: %v", ast["verifier_set_version"])
	}
	before := get()
	if before.LastRotatedAt != nil {
		t.Fatalf("last_rotated_at before any rotation: %v", before.LastRotatedAt)
	}

	file := filepath.Join(t.TempDir(), "token.yaml")
	yaml := fmt.Sprintf("kind: token\nmetadata: {name: rotor}\nspec:\n  join_method: bound-keypair\n  node: rotor\n"+
		"  bound_keypair:\n    onboarding: {initial_public_key: %q}\n    recovery: {limit: 1, mode: standard}\n    rotate_after: %q\n",
		pubLine, time.Now().Add(-time.Minute).UTC().Format(time.RFC3339))
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "token", "apply", "-f", file, "--data", e.dir)

	joined := agentState(t, adir)
	oldKey, err := os.ReadFile(agent.Dir(adir).BoundKeyFile())
	if err != nil {
		t.Fatal(err)
	}
	p, _ := startProc(t, "agent", "agent started", "agent", "run", "--data", adir, "--log-format", "json")
	waitLog(t, p, "bound key rotated", 1, 20*time.Second)
	waitLog(t, p, "refresh done", 2, 20*time.Second)
	p.stop(t)
	if n := strings.Count(p.Logs(), `"msg":"made a new bound key for the rotation the authority asked for"`); n != 1 {
		t.Fatalf("the agent made %d new keys, want 1:\n%s", n, p.Logs())
	}

	after := get()
	priv, err := agent.LoadBoundKey(agent.Dir(adir))
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := boundkeypair.NewPublicKey(priv.Public().(ed25519.PublicKey))
	if after.BoundKeyFingerprint == before.BoundKeyFingerprint || after.BoundKeyFingerprint != pub.Fingerprint() {
		t.Fatalf("bound key %s after the rotation (was %s), the agent holds %s", after.BoundKeyFingerprint, before.BoundKeyFingerprint, pub.Fingerprint())
	}
	if after.LastRotatedAt == nil || after.RecoveryCount != before.RecoveryCount {
		t.Fatalf("token after the rotation: %+v (before %+v)", after, before)
	}
	if _, err := os.Stat(agent.Dir(adir).NextBoundKeyFile()); !os.IsNotExist(err) {
		t.Fatalf("a pending key is left after the rotation: %v", err)
	}
	if st := agentState(t, adir); st.InstanceID != joined.InstanceID {
		t.Fatalf("a refresh that rotated made instance %s, want %s", st.InstanceID, joined.InstanceID)
	}
	if show := mustRun(t, "token", "get", "rotor", "--data", e.dir); !strings.Contains(show, after.BoundKeyFingerprint) {
		t.Errorf("token get does not show the new key:\n%s", show)
	}

	// agents list and show: the bound key and the recoveries left (limit
	// 1, the first join counted: 0).
	list := mustRun(t, "agents", "list", "--data", e.dir)
	if !strings.Contains(list, "RECOVERIES LEFT") || !regexp.MustCompile(`(?m)^rotor\s+bound-keypair\s+\S+\s+\d+\s+\S+\s+0\s`).MatchString(list) {
		t.Errorf("agents list lacks the recoveries remaining:\n%s", list)
	}
	show := mustRun(t, "agents", "show", "rotor", "--data", e.dir)
	if !strings.Contains(show, "Bound key: "+after.BoundKeyFingerprint) || !strings.Contains(show, "Recoveries remaining: 0") ||
		!strings.Contains(show, "PREVIOUS") {
		t.Errorf("agents show lacks the bound key or the recoveries:\n%s", show)
	}
	var doc struct {
		Agent struct {
			Stream struct {
				Heartbeat struct {
					RecoveriesRemaining *int64 `json:"recoveries_remaining"`
				} `json:"heartbeat"`
			} `json:"stream"`
			BoundKeypair struct {
				BoundKeyFingerprint string `json:"bound_key_fingerprint"`
				RecoveriesRemaining int64  `json:"recoveries_remaining"`
			} `json:"bound_keypair"`
		} `json:"agent"`
	}
	// The agent's heartbeat reports its budget too. Its stream reconnects
	// with every certificate (6 s here), and a stream just opened has sent
	// no heartbeat yet: read until one has.
	waitFor(t, agentReach, "a heartbeat reporting the recoveries remaining", func() bool {
		doc.Agent.Stream.Heartbeat.RecoveriesRemaining = nil
		if err := json.Unmarshal([]byte(mustRun(t, "agents", "show", "rotor", "--data", e.dir, "-o", "json")), &doc); err != nil {
			t.Fatal(err)
		}
		return doc.Agent.Stream.Heartbeat.RecoveriesRemaining != nil
	})
	if b := doc.Agent.BoundKeypair; b.BoundKeyFingerprint != after.BoundKeyFingerprint || b.RecoveriesRemaining != 0 {
		t.Errorf("agents show -o json: %+v", b)
	}
	if n := doc.Agent.Stream.Heartbeat.RecoveriesRemaining; *n != 0 {
		t.Errorf("heartbeat recoveries remaining: %d, want 0", *n)
	}

	// The rotation's reply lost after the authority bound the new key: the
	// agent still holds the old key as bound.key and the new one pending.
	// Its next refresh is refused with the old key, proves the pending one,
	// and keeps it.
	d := agent.Dir(adir)
	newKey, err := os.ReadFile(d.BoundKeyFile())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.NextBoundKeyFile(), newKey, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.BoundKeyFile(), oldKey, 0o600); err != nil {
		t.Fatal(err)
	}
	p, _ = startProc(t, "agent", "agent started", "agent", "run", "--data", adir, "--log-format", "json")
	waitLog(t, p, "refresh done", 1, 20*time.Second)
	p.stop(t)
	if !strings.Contains(p.Logs(), "proving the pending key") {
		t.Fatalf("the agent did not fall back to the pending key:\n%s", p.Logs())
	}
	if held, _ := os.ReadFile(d.BoundKeyFile()); string(held) != string(newKey) {
		t.Fatal("bound.key is not the key the authority bound")
	}
	if _, err := os.Stat(d.NextBoundKeyFile()); !os.IsNotExist(err) {
		t.Fatalf("the pending key is left: %v", err)
	}
	if got := get(); got.BoundKeyFingerprint != after.BoundKeyFingerprint {
		t.Fatalf("the bound key moved to %s", got.BoundKeyFingerprint)
	}
}
