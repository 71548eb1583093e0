package e2e

import (
	"crypto/ed25519"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/agent"
	"github.com/muster-dev/muster/internal/boundkeypair"
)

// TestBoundKeypairCloneKeepTheOneBehind: a bound-keypair agent's data
// directory copied to a second machine, the copy recovering first (so the
// genuine machine's join state is behind and locks the token), and the
// operator keeping the genuine machine by the way out its refusal and the
// audit record name, pasted: muster lock delete ID alone only lets the
// copy back (the genuine one locks again), so the copy is stopped and the
// token made anew.
func TestBoundKeypairCloneKeepTheOneBehind(t *testing.T) {
	t.Parallel()
	e, genuine, clone := newBoundKeypairClone(t)
	// Both stopped past the certificate's end; the copy comes back first.
	waitExpired(t, genuine)
	mustRun(t, "agent", "renew", "--data", clone)
	msg := mustFail(t, "agent", "renew", "--data", genuine)
	for _, want := range []string{"join_state_mismatch", "muster lock delete ID only lets the other back in",
		"muster token delete runner, muster bot add runner --recovery-limit 3, and here",
		"and here muster agent join --force --data " + genuine + " --bound-keypair runner --registration-secret-file F"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the genuine machine's refusal %q does not say %q", msg, want)
		}
	}
	var locks []struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "lock", "list", "--data", e.dir, "-o", "json")), &locks); err != nil || len(locks) != 1 {
		t.Fatalf("lock list: %v %+v", err, locks)
	}
	lockID := locks[0].ID
	audit := mustRun(t, "audit", "list", "--data", e.dir, "--action", "agent.join")
	if want := "to keep this one, stop the other, then muster lock delete " + lockID + ", muster token delete runner, muster bot add runner"; !strings.Contains(audit, want) {
		t.Errorf("the audit record of the stale join state does not say %q:\n%s", want, audit)
	}

	// Deleting the lock alone: the machine behind locks the token again.
	mustRun(t, "lock", "delete", lockID, "--data", e.dir)
	mustFail(t, "agent", "renew", "--data", genuine)
	if out := mustRun(t, "lock", "list", "--data", e.dir); !strings.Contains(out, lockID) {
		t.Fatalf("the machine behind did not lock the token again:\n%s", out)
	}

	// The way out, as named: the copy stopped (gone), then the lock, the
	// token, a new one, and the genuine machine joins over its identity.
	if err := os.RemoveAll(clone); err != nil {
		t.Fatal(err)
	}
	// Deleted first, the token leaves its lock, and says so.
	if out := mustRun(t, "token", "delete", "runner", "--data", e.dir); !strings.Contains(out, "Lock "+lockID+" on token runner remains") ||
		!strings.Contains(out, "muster lock delete "+lockID) {
		t.Errorf("token delete does not name the lock left on the name:\n%s", out)
	}
	mustRun(t, "lock", "delete", lockID, "--data", e.dir)
	again := botOf(t, mustRun(t, "bot", "add", "runner", "--data", e.dir, "-o", "json"))
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte(again.BoundKeypair.RegistrationSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "agent", "join", "--force", "--data", genuine, "--bound-keypair", "runner", "--registration-secret-file", secret)
	mustRun(t, "agent", "renew", "--data", genuine)
	if out := mustRun(t, "lock", "list", "--data", e.dir); strings.Contains(out, "runner") {
		t.Errorf("locks left after the way out:\n%s", out)
	}
}

// TestBoundKeypairDirRestoredFromBeforeARotation: the agent's data
// directory restored from a backup taken before its bound key was rotated
// holds a key the token is no longer bound to. Its refusal
// (challenge_failed) names where to compare the keys (muster agent status
// shows this machine's, muster token get the token's) and the way back,
// which works pasted.
func TestBoundKeypairDirRestoredFromBeforeARotation(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t, "--agent-cert-ttl", "6s")
	adir := filepath.Join(t.TempDir(), "agent")
	joinBoundKeypair(t, e, adir, "rotor", "3")
	backup := filepath.Join(t.TempDir(), "backup")
	if out, err := exec.Command("cp", "-a", adir, backup).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	oldKey := botOf(t, mustRun(t, "token", "get", "rotor", "--data", e.dir, "-o", "json")).BoundKeypair.BoundKeyFingerprint

	// The operator's way to rotate: edit what token get printed.
	spec := mustRun(t, "token", "get", "rotor", "--data", e.dir, "-o", "yaml")
	due := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	if !strings.Contains(spec, `rotate_after: ""`) {
		t.Fatalf("token get -o yaml has no empty rotate_after:\n%s", spec)
	}
	file := filepath.Join(t.TempDir(), "token.yaml")
	if err := os.WriteFile(file, []byte(strings.Replace(spec, `rotate_after: ""`, `rotate_after: "`+due+`"`, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "token", "apply", "-f", file, "--data", e.dir)
	mustRun(t, "agent", "renew", "--data", adir)
	newKey := botOf(t, mustRun(t, "token", "get", "rotor", "--data", e.dir, "-o", "json")).BoundKeypair.BoundKeyFingerprint
	if newKey == oldKey {
		t.Fatalf("the renewal did not rotate the key (%s)", newKey)
	}

	// The machine is rebuilt from the backup.
	if err := os.RemoveAll(adir); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", backup, adir).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	msg := mustFail(t, "agent", "renew", "--data", adir)
	for _, want := range []string{"challenge_failed", "compare muster agent status --data " + adir, "with muster token get rotor",
		"muster token delete rotor, muster bot add rotor --recovery-limit 3, and here",
		"and here muster agent join --force --data " + adir + " --bound-keypair rotor --registration-secret-file F"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the refusal %q does not say %q", msg, want)
		}
	}
	if status := mustRun(t, "agent", "status", "--data", adir); !strings.Contains(status, "key "+oldKey+",") {
		t.Errorf("agent status does not show the machine's key %s:\n%s", oldKey, status)
	}
	var js struct {
		BoundKeyFingerprint string `json:"bound_key_fingerprint"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "agent", "status", "--data", adir, "-o", "json")), &js); err != nil || js.BoundKeyFingerprint != oldKey {
		t.Errorf("agent status -o json bound_key_fingerprint %q, want %s (%v)", js.BoundKeyFingerprint, oldKey, err)
	}

	// The way back, as named.
	mustRun(t, "token", "delete", "rotor", "--data", e.dir)
	again := botOf(t, mustRun(t, "bot", "add", "rotor", "--data", e.dir, "-o", "json"))
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte(again.BoundKeypair.RegistrationSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "agent", "join", "--force", "--data", adir, "--bound-keypair", "rotor", "--registration-secret-file", secret)
	mustRun(t, "agent", "renew", "--data", adir)
}

// TestBoundKeypairCloneWayOutShutsTheCopyOut: the clone way out of the
// guide (keep the holder behind: new token of the same name, join --force
// with its registration secret) leaves the copy nothing that joins, even
// inside a resync window: the genuine machine's new join made a fresh
// bound key, and the copy's join state, signed for the deleted token of
// that name, is not the new token's.
func TestBoundKeypairCloneWayOutShutsTheCopyOut(t *testing.T) {
	t.Parallel()
	e, genuine, clone := newBoundKeypairClone(t)
	waitExpired(t, genuine)
	mustRun(t, "agent", "renew", "--data", clone)
	mustFail(t, "agent", "renew", "--data", genuine)
	var locks []struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "lock", "list", "--data", e.dir, "-o", "json")), &locks); err != nil || len(locks) != 1 {
		t.Fatalf("lock list: %v %+v", err, locks)
	}
	oldKey := botOf(t, mustRun(t, "token", "get", "runner", "--data", e.dir, "-o", "json")).BoundKeypair.BoundKeyFingerprint

	// The way out keeping the genuine machine; the copy is not found, and
	// keeps its directory (the key and the join state ahead).
	mustRun(t, "lock", "delete", locks[0].ID, "--data", e.dir)
	mustRun(t, "token", "delete", "runner", "--data", e.dir)
	again := botOf(t, mustRun(t, "bot", "add", "runner", "--recovery-limit", "3", "--data", e.dir, "-o", "json"))
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte(again.BoundKeypair.RegistrationSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "agent", "join", "--force", "--data", genuine, "--bound-keypair", "runner", "--registration-secret-file", secret)
	if got := botOf(t, mustRun(t, "token", "get", "runner", "--data", e.dir, "-o", "json")).BoundKeypair.BoundKeyFingerprint; got == oldKey {
		t.Errorf("join --force with the new token's registration secret bound the key %s the copy holds", got)
	}

	// A resync window (for a restore elsewhere) admits nothing of the copy.
	mustRun(t, "bound-keypair", "resync", "open", "--for", "1h", "--reason", "restored muster.db from the test backup", "--data", e.dir)
	waitExpired(t, clone)
	if r := muster(t, nil, "agent", "renew", "--data", clone); r.code == 0 {
		t.Fatalf("the copy recovered into the new token:\n%s", r.stdout)
	}
	mustRun(t, "agent", "renew", "--data", genuine)
}

// TestBoundKeypairCloneWayOutKeepingTheKey: the clone way out with the
// genuine machine's own key registered again (bot add --public-key, then
// join --force without a secret): the copy holds that key too, but its
// join state, ahead of the new token's, is the deleted token's, and is
// refused inside a resync window as outside it.
func TestBoundKeypairCloneWayOutKeepingTheKey(t *testing.T) {
	t.Parallel()
	e, genuine, clone := newBoundKeypairClone(t)
	waitExpired(t, genuine)
	mustRun(t, "agent", "renew", "--data", clone)
	mustFail(t, "agent", "renew", "--data", genuine)
	var locks []struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "lock", "list", "--data", e.dir, "-o", "json")), &locks); err != nil || len(locks) != 1 {
		t.Fatalf("lock list: %v %+v", err, locks)
	}
	mustRun(t, "lock", "delete", locks[0].ID, "--data", e.dir)
	mustRun(t, "token", "delete", "runner", "--data", e.dir)
	priv, err := agent.LoadBoundKey(agent.Dir(genuine))
	if err != nil {
		t.Fatal(err)
	}
	pub, err := boundkeypair.NewPublicKey(priv.Public().(ed25519.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	pubFile := filepath.Join(t.TempDir(), "runner.pub")
	if err := os.WriteFile(pubFile, []byte(pub.String()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "bot", "add", "runner", "--public-key", pubFile, "--recovery-limit", "3", "--data", e.dir)
	mustRun(t, "agent", "join", "--force", "--data", genuine, "--bound-keypair", "runner", "--authority", e.auth.addr, "--ca-fingerprint", e.fingerprint)

	mustRun(t, "bound-keypair", "resync", "open", "--for", "1h", "--reason", "restored muster.db from the test backup", "--data", e.dir)
	waitExpired(t, clone)
	if r := muster(t, nil, "agent", "renew", "--data", clone); r.code == 0 {
		t.Fatalf("the copy recovered into the new token with the deleted token's join state:\n%s", r.stdout)
	}
	if audit := mustRun(t, "audit", "list", "--data", e.dir, "--action", "agent.join"); !strings.Contains(audit, "a token of the same name deleted since") {
		t.Errorf("the refusal's audit record does not say the join state is a deleted token's:\n%s", audit)
	}
	if out := mustRun(t, "lock", "list", "--data", e.dir); strings.Contains(out, "runner") {
		t.Errorf("the copy's refusal locked the token:\n%s", out)
	}
	mustRun(t, "agent", "renew", "--data", genuine)
}

// newBoundKeypairClone starts an authority whose agent certificates last
// 6 s, joins a bound-keypair agent with the token runner (recovery limit
// 3) into genuine, and copies its data directory to clone, as a machine's
// disk image is copied.
func newBoundKeypairClone(t *testing.T) (e *agentEnv, genuine, clone string) {
	t.Helper()
	e = newAgentEnv(t, "--agent-cert-ttl", "6s")
	bot := botOf(t, mustRun(t, "bot", "add", "runner", "--recovery-limit", "3", "--data", e.dir, "-o", "json"))
	genuine = filepath.Join(t.TempDir(), "genuine")
	if r := muster(t, []string{"MUSTER_JOIN_URI=" + bot.URI}, "agent", "join", "--data", genuine); r.code != 0 {
		t.Fatalf("join: %s", r.stderr)
	}
	clone = filepath.Join(t.TempDir(), "clone")
	if out, err := exec.Command("cp", "-a", genuine, clone).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	return e, genuine, clone
}
