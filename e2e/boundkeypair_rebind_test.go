package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestBoundKeypairRestoreRebind: through the built binary, the store is
// restored from a backup taken before one agent rotated its bound key
// (rotate_after in the past) and before another registered with its
// secret. Without a resync window both are refused and nothing is locked;
// with one open, the same agent runs recover: each resync rebinds its
// token to the key the agent's join state names, audited with both keys;
// both keep refreshing afterwards, and no secret is issued again.
func TestBoundKeypairRestoreRebind(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t, "--agent-cert-ttl", "6s")
	addr := e.auth.addr
	adir := filepath.Join(t.TempDir(), "runner")
	pubLine := joinBoundKeypair(t, e, adir, "runner", "5")
	var reg botInfo
	if err := json.Unmarshal([]byte(mustRun(t, "bot", "add", "builder", "--data", e.dir, "-o", "json")), &reg); err != nil {
		t.Fatal(err)
	}
	restart := func() {
		e.auth.stop(t)
		e.auth = startAuthority(t, e.dir, "--listen", addr, "--agent-cert-ttl", "6s")
	}
	key := func(name string) string {
		return botOf(t, mustRun(t, "token", "get", name, "--data", e.dir, "-o", "json")).BoundKeypair.BoundKeyFingerprint
	}

	// The backup, taken with the authority stopped.
	backup := t.TempDir()
	e.auth.stop(t)
	copyStore(t, e.dir, backup)
	e.auth = startAuthority(t, e.dir, "--listen", addr, "--agent-cert-ttl", "6s")
	oldKey := key("runner")

	// After the backup: runner rotates at its next refresh, builder
	// registers with the secret of its joining URI.
	file := filepath.Join(t.TempDir(), "token.yaml")
	yaml := fmt.Sprintf("kind: token\nmetadata: {name: runner}\nspec:\n  join_method: bound-keypair\n  node: runner\n"+
		"  bound_keypair:\n    onboarding: {initial_public_key: %q}\n    recovery: {limit: 5, mode: standard}\n    rotate_after: %q\n",
		pubLine, time.Now().Add(-time.Minute).UTC().Format(time.RFC3339))
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "token", "apply", "-f", file, "--data", e.dir)
	p, _ := startProc(t, "agent", "agent started", "agent", "run", "--data", adir, "--log-format", "json")
	waitLog(t, p, "bound key rotated", 1, 30*time.Second)
	p.stop(t)
	newKey := key("runner")
	if newKey == oldKey || newKey == "" {
		t.Fatalf("runner's key after the rotation: %s (was %s)", newKey, oldKey)
	}
	bdir := filepath.Join(t.TempDir(), "builder")
	if r := muster(t, []string{"MUSTER_JOIN_URI=" + reg.URI}, "agent", "join", "--data", bdir); r.code != 0 {
		t.Fatalf("builder's registration: exit %d\n%s", r.code, r.stderr)
	}
	builderKey := key("builder")

	// The restore, as the operator guide says.
	e.auth.stop(t)
	copyStore(t, backup, e.dir)
	os.Remove(filepath.Join(e.dir, "audit-head"))
	os.Rename(filepath.Join(e.dir, "audit-checkpoint.json"), filepath.Join(t.TempDir(), "audit-checkpoint.json"))
	restart()
	if key("runner") != oldKey || key("builder") != "" {
		t.Fatalf("after the restore: runner %s (want %s), builder %q (want none)", key("runner"), oldKey, key("builder"))
	}

	// Without a window: both refused, nothing locked.
	waitExpired(t, adir)
	waitExpired(t, bdir)
	for _, dir := range []string{adir, bdir} {
		if r := muster(t, nil, "agent", "run", "--data", dir, "--log-format", "json"); r.code == 0 || !strings.Contains(r.stderr, "recovery failed") {
			t.Fatalf("agent run in %s after the restore, no window: exit %d\n%s", dir, r.code, r.stderr)
		}
	}
	if locks := mustRun(t, "lock", "list", "--data", e.dir); strings.Contains(locks, "runner") || strings.Contains(locks, "builder") {
		t.Fatalf("a restore locked a token:\n%s", locks)
	}

	// With a window: both recover, rebound to their keys, and keep
	// refreshing.
	mustRun(t, "bound-keypair", "resync", "open", "--for", "1h", "--reason", "restored muster.db from the test backup", "--data", e.dir)
	for _, dir := range []string{adir, bdir} {
		p, _ := startProc(t, "agent", "agent started", "agent", "run", "--data", dir, "--log-format", "json")
		waitLog(t, p, "recovery done", 1, 30*time.Second)
		waitLog(t, p, "refresh done", 1, 30*time.Second)
		p.stop(t)
	}
	if key("runner") != newKey || key("builder") != builderKey {
		t.Fatalf("after the resyncs: runner %s (want %s), builder %s (want %s)", key("runner"), newKey, key("builder"), builderKey)
	}
	audit := mustRun(t, "audit", "list", "--data", e.dir, "--action", "token.resync")
	if !strings.Contains(audit, "rebound from "+oldKey+" to "+newKey) || !strings.Contains(audit, "rebound from none to "+builderKey) {
		t.Fatalf("the rebinds are not audited with both keys:\n%s", audit)
	}
	if n := recoveryCount(t, e.dir, "runner"); n != 1 {
		t.Fatalf("runner's recovery_count after the resync = %d, want the backup's 1 (a resync takes none)", n)
	}
	// No secret was issued again: builder's was never shown after bot add.
	if got := botOf(t, mustRun(t, "token", "get", "builder", "--data", e.dir, "-o", "json")); got.BoundKeypair.RegistrationSecret != "" {
		t.Fatalf("token get shows a registration secret: %+v", got)
	}
	if locks := mustRun(t, "lock", "list", "--data", e.dir); strings.Contains(locks, "runner") || strings.Contains(locks, "builder") {
		t.Fatalf("a rebind locked a token:\n%s", locks)
	}
}
