package e2e

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestCapFollowsTheServicesFileLimit: the connection cap's default comes
// from the open-file limit of the process that applies it. An authority
// started under a lower limit than the operator's shell (LimitNOFILE in a
// systemd unit, a container's ulimit) logs the cap it applies from its own
// limit, and --check-config says that the limit it printed is its own.
func TestCapFollowsTheServicesFileLimit(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	check := mustRun(t, "authority", "--data", dir, "--check-config")
	if !strings.Contains(check, "open_file_limit:") || !strings.Contains(check, "this command's: the authority reads its own at start") {
		t.Errorf("--check-config does not say whose open-file limit it read:\n%s", check)
	}
	// As a service manager would: 1,024 files, soft and hard.
	cmd := exec.Command("sh", "-c", `ulimit -n 1024 && exec "$0" "$@"`, musterBin, "authority", "--data", dir,
		"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--log-format", "json")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	_, rec := startCmd(t, "authority", "authority started", cmd)
	// 1,024 less 256 of headroom.
	if rec["max_connections"] != float64(768) || rec["open_file_limit"] != "1024" {
		t.Errorf("the start log says max_connections %v from an open-file limit of %v; want 768 from 1024", rec["max_connections"], rec["open_file_limit"])
	}
}
