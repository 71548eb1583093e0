package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/muster-dev/muster/internal/shellword"
)

// TestSQLiteRestoreWalk follows the operator guide's "Backing up and
// restoring the SQLite store" as written: a copy of muster.db taken with
// the authority stopped, a lock made after it, the store put back with
// the newer one kept aside. The authority refuses the restored store, and
// the way out it names works pasted into a shell, keeping the audit files
// as evidence: it once said "remove FILE and FILE", prose, and nothing of
// what the restore undid. What it undid (the lock) is then read from the
// store kept aside, as the guide says.
func TestSQLiteRestoreWalk(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	db := filepath.Join(dir, "muster.db")
	a := startAuthority(t, dir)
	a.stop(t)
	backup := filepath.Join(t.TempDir(), "muster.db")
	copyFile(t, db, backup)

	a = startAuthority(t, dir)
	mustRun(t, "lock", "create", "--node", "stolen-01", "--reason", "after the backup", "--data", dir)
	// An operator identity issued after the backup: the restored store
	// has no record of it.
	work := t.TempDir()
	bob := filepath.Join(work, "bob.pem")
	mustRun(t, "admin", "add", "bob", "--out", bob, "--data", dir)
	a.stop(t)

	// The restore: the newer store (with its -wal and -shm, if any)
	// moved aside together, the backup copied in.
	aside := filepath.Join(dir, "muster.db.before-restore")
	for _, suffix := range []string{"", "-wal", "-shm"} {
		if err := os.Rename(db+suffix, aside+suffix); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	copyFile(t, backup, db)

	r := muster(t, nil, "authority", "--data", dir, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0")
	const lead = "kept as the evidence of what it removed: "
	_, cmd, ok := strings.Cut(strings.TrimSpace(r.stderr), lead)
	if r.code == 0 || !ok || !strings.Contains(r.stderr, `docs/operator-guide.md, "Backing up and restoring the SQLite store"`) {
		t.Fatalf("the authority on the restored store: exit %d, stderr %s; want a way out after %q naming what a restore undoes", r.code, r.stderr, lead)
	}
	if out, err := exec.Command("sh", "-c", cmd).CombinedOutput(); err != nil {
		t.Fatalf("the way out %q pasted: %v: %s", cmd, err, out)
	}
	kept, _ := filepath.Glob(filepath.Join(dir, "audit-before-restore.*", "audit-*"))
	if len(kept) != 2 {
		t.Errorf("the audit files kept aside: %q, want audit-head and audit-checkpoint.json", kept)
	}

	a = startAuthority(t, dir)
	// bob's identity, signed by an intermediate the store still holds,
	// is refused: the restored store never issued it. The refusal names
	// the way out, with the authority's own data directory, which pasted
	// as it is works.
	r = muster(t, nil, "admin", "list", "--identity", bob, "--authority", a.addr)
	breakGlass := "muster admin add bob --offline --data " + shellword.Quote(dir) + " --out bob-new.pem"
	if r.code == 0 || !strings.Contains(r.stderr, "not in this authority's store") || !strings.Contains(r.stderr, breakGlass) {
		t.Fatalf("admin list with an identity issued after the backup: exit %d\nstdout: %s\nstderr: %s\nwant it refused, naming %q", r.code, r.stdout, r.stderr, breakGlass)
	}
	if out := mustRun(t, "audit", "list", "--data", dir, "--action", "api.access"); !strings.Contains(out, breakGlass) {
		t.Errorf("the refusal's audit record does not name the way out %q: %s", breakGlass, out)
	}
	paste := exec.Command("sh", "-c", breakGlass)
	paste.Dir, paste.Env = work, []string{"PATH=" + filepath.Dir(musterBin) + ":" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	if out, err := paste.CombinedOutput(); err != nil {
		t.Fatalf("the way out %q pasted: %v\n%s", breakGlass, err, out)
	}
	if out := mustRun(t, "admin", "list", "--identity", filepath.Join(work, "bob-new.pem"), "--authority", a.addr); !strings.Contains(out, "bob") {
		t.Errorf("admin list with the new identity: %s", out)
	}
	if out := mustRun(t, "audit", "verify", "--data", dir); !strings.Contains(out, "intact") {
		t.Errorf("audit verify after the restore: %s", out)
	}
	if out := mustRun(t, "lock", "list", "--data", dir); strings.Contains(out, "stolen-01") {
		t.Errorf("the lock made after the backup is in the restored store: %s", out)
	}
	// What the restore undid, from the store kept aside.
	if out := mustRun(t, "audit", "list", "--offline", "--data", dir, "--store", "sqlite://"+aside, "--action", "lock.*"); !strings.Contains(out, "stolen-01") {
		t.Errorf("audit list of the store kept aside lacks the lock made after the backup: %s", out)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
