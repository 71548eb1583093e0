package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// readOnlyTemp is a shell script for unshare: in a mount namespace of its
// own it makes every directory SQLite looks at for temporary files
// read-only (/var/tmp, /usr/tmp, /tmp, and the working directory, /tmp),
// leaving the data directory, $1, writable, as a container with a
// read-only root filesystem and only its data volume writable; then it
// runs the rest of its arguments.
const readOnlyTemp = `set -e
data=$1; shift
mount --bind "$data" "$data"
for d in /var/tmp /usr/tmp /tmp; do
  if [ -d "$d" ] && [ ! -L "$d" ]; then mount --rbind "$d" "$d"; mount -o remount,bind,ro "$d"; fi
done
cd /tmp
exec "$@"`

// An authority on SQLite whose temporary files have nowhere to go (a
// read-only root and no writable /tmp) says so when it starts, naming the
// fix, since SQLite itself says nothing until a large sort or index build
// (an upgrade's migration) fails with "disk I/O error"; given
// SQLITE_TMPDIR, it does not.
func TestAuthorityWithoutATempDirSaysSo(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		// .ci/run sets MUSTER_REQUIRE_ROOT: CI runs it as root, never
		// skips it.
		skipUnlessRequired(t, "MUSTER_REQUIRE_ROOT", "needs root for a mount namespace with a read-only /tmp")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Fatalf("unshare (util-linux): %v", err)
	}
	dir := filepath.Join(t.TempDir(), "authority")
	mustRun(t, "init", "--data", dir)
	for _, tc := range []struct {
		env  []string
		warn bool
	}{
		{nil, true},
		{[]string{"SQLITE_TMPDIR=" + dir}, false},
	} {
		args := []string{"-m", "--propagation", "private", "sh", "-c", readOnlyTemp, "sh", dir,
			musterBin, "authority", "--data", dir, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--log-format", "json"}
		cmd := exec.Command(unshare, args...)
		cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, tc.env...)
		p, _ := startCmd(t, "authority", "authority started", cmd)
		warned := ""
		for _, l := range strings.Split(p.Logs(), "\n") {
			if strings.Contains(l, `"level":"WARN"`) && strings.Contains(l, "SQLite has no writable directory") {
				warned = l
			}
		}
		switch {
		case tc.warn && (warned == "" || !strings.Contains(warned, "/tmp") || !strings.Contains(warned, "SQLITE_TMPDIR")):
			t.Errorf("no warning naming /tmp and SQLITE_TMPDIR with %v:\n%s", tc.env, p.Logs())
		case !tc.warn && warned != "":
			t.Errorf("warned with %v: %s", tc.env, warned)
		}
		p.stop(t)
	}
}
