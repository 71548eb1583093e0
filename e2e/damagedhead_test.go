package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/muster-dev/muster/internal/shellword"
)

// TestDamagedAuditHeadWayOut: an authority started with --config FILE
// outside its data directory, the store URL only there (as under the
// packaged unit), whose audit-head is damaged refuses to start as damaged
// (not as records removed), naming the offline audit verify with
// --config FILE and the file's removal; pasted, the verify walks that
// store's chain and finds only the file wrong, and once the removal is
// pasted the authority starts and writes audit-head anew.
func TestDamagedAuditHeadWayOut(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data dir")
	mustRun(t, "init", "--data", dir)
	db := filepath.Join(t.TempDir(), "the store", "muster.db")
	if err := os.MkdirAll(filepath.Dir(db), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, suffix := range []string{"", "-wal", "-shm"} {
		if err := os.Rename(filepath.Join(dir, "muster.db")+suffix, db+suffix); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	cfg := filepath.Join(t.TempDir(), "etc muster", "authority.yaml")
	if err := os.MkdirAll(filepath.Dir(cfg), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, []byte("store: sqlite://"+db+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	startAuthority(t, dir, "--config", cfg).stop(t)
	head := filepath.Join(dir, "audit-head")
	if err := os.WriteFile(head, []byte("17 not-hex"), 0o600); err != nil {
		t.Fatal(err)
	}

	line := mustFail(t, "authority", "--data", dir, "--config", cfg, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0")
	verify := "muster audit verify --offline --data " + shellword.Quote(dir) + " --config " + shellword.Quote(cfg)
	rm := "rm " + shellword.Quote(head)
	for _, want := range []string{head + " is damaged", `it holds "17 not-hex"`, "walk the chain with " + verify + ";", rm + " "} {
		if !strings.Contains(line, want) {
			t.Errorf("the refusal lacks %q:\n%s", want, line)
		}
	}
	if strings.Contains(line, "lost records") {
		t.Errorf("a damaged head file refused as records removed: %s", line)
	}
	paste := func(cmd string) (string, error) {
		out, err := exec.Command("sh", "-c", strings.Replace(cmd, "muster ", shellword.Quote(musterBin)+" ", 1)).CombinedOutput()
		return string(out), err
	}
	out, err := paste(verify)
	if err == nil || !strings.Contains(out, "every record is in place") || !strings.Contains(out, rm) || strings.Contains(out, "at record 0") {
		t.Fatalf("the pasted %s: %v\n%s", verify, err, out)
	}
	if out, err := paste(rm); err != nil {
		t.Fatalf("the pasted %s: %v\n%s", rm, err, out)
	}
	a := startAuthority(t, dir, "--config", cfg)
	logsOnFailure(t, "authority", a.Logs)
	a.stop(t)
	if b, err := os.ReadFile(head); err != nil || len(strings.Fields(string(b))) != 2 {
		t.Errorf("audit-head after the start: %q, %v", b, err)
	}
	mustRun(t, "audit", "verify", "--offline", "--data", dir, "--config", cfg)
}
