package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// TestStoreBackupWhileServing takes a backup with muster store backup
// while the authority serves and an agent renews against it, then
// restores it as the operator guide says and starts the authority on
// it. The guide once sent operators to the sqlite3 shell, which muster
// does not need and a host may not have.
func TestStoreBackupWhileServing(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	dir := e.dir
	tok := e.createToken(t, "--uses", "1")
	adir := filepath.Join(t.TempDir(), "agent")
	if r := muster(t, nil, "agent", "join", "--data", adir, "--node", "n1", tok.URI); r.code != 0 {
		t.Fatalf("agent join: exit %d\n%s", r.code, r.stderr)
	}
	mustRun(t, "agent", "renew", "--data", adir)

	// The agent renews while the backup is taken (each renewal is a
	// write to the store), up to 5 times: well within the renewals a
	// certificate's lifetime allows.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	renewals := 0
	wg.Go(func() {
		for renewals < 5 {
			select {
			case <-stop:
				return
			default:
			}
			out, err := exec.Command(musterBin, "agent", "renew", "--data", adir).CombinedOutput()
			if err != nil {
				t.Errorf("agent renew while the backup is taken: %v\n%s", err, out)
				return
			}
			renewals++
		}
	})
	backups := t.TempDir()
	backup := filepath.Join(backups, "muster.db")
	out := mustRun(t, "store", "backup", "--data", dir, "--out", backup)
	close(stop)
	wg.Wait()
	t.Logf("%d renewals while the backup ran", renewals)
	for _, want := range []string{"Backup written: " + backup, "integrity check ok", filepath.Join(dir, "storage.key"), "secrets"} {
		if !strings.Contains(out, want) {
			t.Errorf("store backup printed no %q:\n%s", want, out)
		}
	}
	fi, err := os.Stat(backup)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("backup mode %v, want 0600", fi.Mode().Perm())
	}
	if left, _ := filepath.Glob(filepath.Join(backups, ".*")); len(left) > 0 {
		t.Errorf("files left beside the backup: %q", left)
	}

	// An existing file is refused, unchanged, unless --force.
	line := mustFail(t, "store", "backup", "--data", dir, "--out", backup)
	if !strings.Contains(line, "--force") {
		t.Errorf("a second backup to the same file: %s; want it refused naming --force", line)
	}
	mustRun(t, "store", "backup", "--data", dir, "--out", backup, "--force")
	if out := mustRun(t, "audit", "list", "--data", dir, "--action", "store.backup"); strings.Count(out, "store.backup") != 2 {
		t.Errorf("audit list --action store.backup after two backups:\n%s", out)
	}

	// Run with a relative --data, it names the files to keep by a path
	// that works from anywhere.
	r := musterIn(t, filepath.Dir(dir), nil, "store", "backup", "--data", filepath.Base(dir), "--out", filepath.Join(backups, "relative.db"))
	if r.code != 0 || !strings.Contains(r.stdout, "keep a copy of "+filepath.Join(dir, "storage.key")) {
		t.Errorf("store backup --data %s: exit %d\n%s%s\nwant it to name %s", filepath.Base(dir), r.code, r.stdout, r.stderr, filepath.Join(dir, "storage.key"))
	}

	// A PostgreSQL store is refused with pg_dump, before any connection.
	line = mustFail(t, "store", "backup", "--data", dir, "--out", filepath.Join(backups, "pg.db"),
		"--store", "postgres://muster@127.0.0.1:1/muster")
	if !strings.Contains(line, "pg_dump -Fc -d") {
		t.Errorf("store backup of a PostgreSQL store: %s; want the pg_dump way out", line)
	}

	// A lock after the backup, undone by the restore.
	mustRun(t, "lock", "create", "--node", "stolen-01", "--reason", "after the backup", "--data", dir)
	addr := e.auth.addr
	e.auth.stop(t)

	// The restore, as docs/operator-guide.md says.
	db := filepath.Join(dir, "muster.db")
	aside := filepath.Join(dir, "muster.db.before-restore")
	for _, suffix := range []string{"", "-wal", "-shm"} {
		if err := os.Rename(db+suffix, aside+suffix); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	copyFile(t, backup, db)
	r = muster(t, nil, "authority", "--data", dir, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0")
	const lead = "kept as the evidence of what it removed: "
	_, cmd, ok := strings.Cut(strings.TrimSpace(r.stderr), lead)
	if r.code == 0 || !ok {
		t.Fatalf("the authority on the restored store: exit %d, stderr %s; want the way out after %q", r.code, r.stderr, lead)
	}
	if out, err := exec.Command("sh", "-c", cmd).CombinedOutput(); err != nil {
		t.Fatalf("the way out %q pasted: %v: %s", cmd, err, out)
	}
	mustRun(t, "store", "reapply", "--offline", "--data", dir, "--from", "sqlite://"+aside, "--apply")
	// On the address the agent knows.
	startAuthority(t, dir, "--listen", addr)
	if out := mustRun(t, "audit", "verify", "--data", dir); !strings.Contains(out, "intact") {
		t.Errorf("audit verify after the restore: %s", out)
	}
	if out := mustRun(t, "lock", "list", "--data", dir); !strings.Contains(out, "stolen-01") {
		t.Errorf("the lock re-applied after the restore is not in force: %s", out)
	}
	// The agent, renewed since the backup, renews against the restored
	// store.
	mustRun(t, "agent", "renew", "--data", adir)
}
