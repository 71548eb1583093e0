package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestRelativeSQLiteStoreInSettingsFile: a settings file outside the data
// directory (as the packaged /etc/muster/authority.yaml) says store:
// sqlite://muster.db. The authority (under systemd it runs in /) and the
// offline commands given that file (--config, MUSTER_CONFIG), run from
// another directory, all open DIR/muster.db: the working directory holds
// no database afterwards.
func TestRelativeSQLiteStoreInSettingsFile(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	cfg := filepath.Join(t.TempDir(), "authority.yaml")
	if err := os.WriteFile(cfg, []byte("store: sqlite://muster.db\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	elsewhere := t.TempDir()
	run := func(env []string, args ...string) {
		t.Helper()
		if r := musterIn(t, elsewhere, env, args...); r.code != 0 {
			t.Fatalf("muster %v (MUSTER_CONFIG %v), run from another directory: exit %d\n%s%s", args, env, r.code, r.stdout, r.stderr)
		}
	}
	run(nil, "audit", "verify", "--offline", "--data", dir, "--config", cfg)
	run([]string{"MUSTER_CONFIG=" + cfg}, "settings", "list", "--offline", "--data", dir)

	cmd := exec.Command(musterBin, "authority", "--data", dir, "--config", cfg,
		"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--log-format", "json")
	cmd.Dir = elsewhere
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	p, _ := startCmd(t, "authority", "authority started", cmd)
	p.stop(t)
	if entries, err := os.ReadDir(elsewhere); err != nil || len(entries) != 0 {
		t.Fatalf("the working directory holds %v (%v): the store was looked for there, not in %s", entries, err, dir)
	}
}
