package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/shellword"
)

// copyStore copies the SQLite store files of the stopped authority in dir
// (the database and, if present, its WAL and shared-memory files) to or
// from backup.
func copyStore(t *testing.T, from, to string) {
	t.Helper()
	for _, name := range []string{"muster.db", "muster.db-wal", "muster.db-shm"} {
		os.Remove(filepath.Join(to, name))
		data, err := os.ReadFile(filepath.Join(from, name))
		if os.IsNotExist(err) {
			continue
		} else if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// keypairFile makes adir's bound key (muster keypair create) and writes its
// public half to a file for bot add --public-key; it returns both.
func keypairFile(t *testing.T, adir string) (pubLine, keyFile string) {
	t.Helper()
	pubLine = strings.TrimSpace(mustRun(t, "keypair", "create", "--data", adir))
	keyFile = filepath.Join(t.TempDir(), "bot.pub")
	if err := os.WriteFile(keyFile, []byte(pubLine+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return pubLine, keyFile
}

// joinBoundKeypair makes adir's keypair, adds the bot name bound to its
// public key with limit recoveries, and joins the agent at adir as that
// bot; it returns the key's public line.
func joinBoundKeypair(t *testing.T, e *agentEnv, adir, name, limit string) (pubLine string) {
	t.Helper()
	pubLine, keyFile := keypairFile(t, adir)
	mustRun(t, "bot", "add", name, "--public-key", keyFile, "--recovery-limit", limit, "--data", e.dir)
	mustRun(t, "agent", "join", "--data", adir, "--bound-keypair", name, "--authority", e.auth.addr, "--ca-fingerprint", e.fingerprint)
	return pubLine
}

// TestBoundKeypairRestore: through the built binary, a bound-keypair agent
// that recovered after the backup its authority's store was restored from.
// Without a resync window its agent run is refused join_state_mismatch and
// nothing is locked (today's behaviour); with `bound-keypair resync open`,
// the same agent run recovers, the token is brought forward without taking
// a recovery, and the resync is audited; a copy of the machine holding a
// pre-restore document is then refused and locks the token; after `resync
// close` the window is shut.
func TestBoundKeypairRestore(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t, "--agent-cert-ttl", "6s")
	addr := e.auth.addr
	adir := filepath.Join(t.TempDir(), "agent")
	joinBoundKeypair(t, e, adir, "runner", "5")

	restart := func() {
		e.auth.stop(t)
		e.auth = startAuthority(t, e.dir, "--listen", addr, "--agent-cert-ttl", "6s")
	}
	recoverOnce := func() {
		t.Helper()
		waitExpired(t, adir)
		p, _ := startProc(t, "agent", "agent started", "agent", "run", "--data", adir, "--log-format", "json")
		waitLog(t, p, "recovery done", 1, 30*time.Second)
		p.stop(t)
	}

	// The backup, taken with the authority stopped.
	backup := t.TempDir()
	e.auth.stop(t)
	copyStore(t, e.dir, backup)
	e.auth = startAuthority(t, e.dir, "--listen", addr, "--agent-cert-ttl", "6s")

	// After the backup the agent recovers twice; a copy of the machine is
	// taken between the two.
	recoverOnce()
	stale := filepath.Join(t.TempDir(), "copy")
	if out, err := exec.Command("cp", "-a", adir, stale).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	recoverOnce()
	if n := recoveryCount(t, e.dir, "runner"); n != 3 {
		t.Fatalf("recovery_count before the restore = %d, want 3", n)
	}

	// The restore, as the operator guide says: the store files back, the
	// audit head file removed, the checkpoint file moved aside.
	e.auth.stop(t)
	copyStore(t, backup, e.dir)
	os.Remove(filepath.Join(e.dir, "audit-head"))
	os.Rename(filepath.Join(e.dir, "audit-checkpoint.json"), filepath.Join(t.TempDir(), "audit-checkpoint.json"))
	restart()
	if n := recoveryCount(t, e.dir, "runner"); n != 1 {
		t.Fatalf("recovery_count after the restore = %d, want the backup's 1", n)
	}

	// Without a window: refused, nothing locked, agent run ends.
	waitExpired(t, adir)
	r := muster(t, nil, "agent", "run", "--data", adir, "--log-format", "json")
	if r.code == 0 || !strings.Contains(r.stderr, "recovery failed: PERMISSION_DENIED") || !strings.Contains(r.stderr, "join_state_mismatch") {
		t.Fatalf("agent run after the restore, no window: exit %d\n%s", r.code, r.stderr)
	}
	if locks := mustRun(t, "lock", "list", "--data", e.dir); strings.Contains(locks, "runner") {
		t.Fatalf("a restore locked the token:\n%s", locks)
	}
	// The refusal's audit record names the way out, a command that works
	// pasted as it is (with the operator's data directory in MUSTER_DATA).
	var records []struct {
		Reason string `json:"reason"`
	}
	audit := mustRun(t, "audit", "list", "--data", e.dir, "--action", "agent.join", "-o", "json")
	if err := json.Unmarshal([]byte(audit), &records); err != nil {
		t.Fatalf("audit list -o json: %v\n%s", err, audit)
	}
	const wayOut = "open a resync window: muster "
	pasted := ""
	for _, r := range records {
		if _, cmd, ok := strings.Cut(r.Reason, wayOut); ok {
			pasted = cmd
		}
	}
	if pasted == "" {
		t.Fatalf("the refusal's audit record does not tell the operator to open a window:\n%s", audit)
	}

	// With a window open, the same agent run recovers.
	if msg := mustFail(t, "bound-keypair", "resync", "open", "--for", "1h", "--data", e.dir); !strings.Contains(msg, "--reason") {
		t.Fatalf("resync open without a reason: %s", msg)
	}
	sh := exec.Command("sh", "-c", shellword.Quote(musterBin)+" "+pasted)
	sh.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "MUSTER_DATA=" + e.dir}
	opened, err := sh.CombinedOutput()
	if err != nil || !strings.Contains(string(opened), "Resync window open until") {
		t.Fatalf("the audit record's way out, pasted (muster %s): %v\n%s", pasted, err, opened)
	}
	if msg := mustFail(t, "bound-keypair", "resync", "open", "--for", "1h", "--reason", "again", "--data", e.dir); !strings.Contains(msg, "is open") {
		t.Fatalf("a second window while one is open: %s", msg)
	}
	var windows []struct {
		Epoch string `json:"epoch"`
		Open  bool   `json:"open"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "bound-keypair", "resync", "status", "--data", e.dir, "-o", "json")), &windows); err != nil ||
		len(windows) != 1 || !windows[0].Open {
		t.Fatalf("resync status: %+v, %v", windows, err)
	}
	p, _ := startProc(t, "agent", "agent started", "agent", "run", "--data", adir, "--log-format", "json")
	waitLog(t, p, "recovery done", 1, 30*time.Second)
	p.stop(t)
	if n := recoveryCount(t, e.dir, "runner"); n != 1 {
		t.Fatalf("recovery_count after the resync = %d, want 1 (a resync takes none)", n)
	}
	var got struct {
		BoundKeypair struct {
			Epoch            string `json:"epoch"`
			RecoverySequence int64  `json:"recovery_sequence"`
		} `json:"bound_keypair"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "token", "get", "runner", "--data", e.dir, "-o", "json")), &got); err != nil ||
		got.BoundKeypair.Epoch != windows[0].Epoch || got.BoundKeypair.RecoverySequence != 4 {
		t.Fatalf("token get after the resync: %+v, %v; want epoch %s at sequence 4 (the agent's 3, brought forward)", got, err, windows[0].Epoch)
	}
	if audit := mustRun(t, "audit", "list", "--data", e.dir, "--action", "token.resync"); !strings.Contains(audit, windows[0].Epoch) {
		t.Fatalf("no token.resync record naming epoch %s:\n%s", windows[0].Epoch, audit)
	}
	if audit := mustRun(t, "audit", "list", "--data", e.dir, "--action", "bound_keypair.resync.*"); !strings.Contains(audit, "restored the store from a backup") {
		t.Fatalf("the window's opening is not audited:\n%s", audit)
	}

	// The copy holds a document from before the restore: once per token,
	// so it is a second holder, refused, and the token is locked.
	r = muster(t, nil, "agent", "run", "--data", stale, "--log-format", "json")
	if r.code == 0 || !strings.Contains(r.stderr, "join_state_mismatch") {
		t.Fatalf("agent run of the copy inside the window: exit %d\n%s", r.code, r.stderr)
	}
	if locks := mustRun(t, "lock", "list", "--data", e.dir); !strings.Contains(locks, "runner") {
		t.Fatalf("the copy did not lock the token:\n%s", locks)
	}

	mustRun(t, "bound-keypair", "resync", "close", "--reason", "all agents back", "--data", e.dir)
	if msg := mustFail(t, "bound-keypair", "resync", "close", "--data", e.dir); !strings.Contains(msg, "no resync window is open") {
		t.Fatalf("closing twice: %s", msg)
	}
	if status := mustRun(t, "bound-keypair", "resync", "status", "--data", e.dir); !strings.Contains(status, "closed by") {
		t.Fatalf("resync status after the close:\n%s", status)
	}
}
