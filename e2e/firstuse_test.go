package e2e

import (
	"fmt"
	"strings"
	"testing"
)

// First-use defects (issue 14, item 8): what a new user met on the way in.

// A second authority on a data directory refuses to start, naming the
// running one, instead of overwriting its authority.addr.
func TestSecondAuthorityOnADirectoryRefuses(t *testing.T) {
	dir, _ := initDir(t)
	a := startAuthority(t, dir)
	defer a.stop(t)
	line := mustFail(t, "authority", "--data", dir, "--listen", "127.0.0.1:0", "--metrics-listen", "")
	if want := fmt.Sprintf("(pid %d)", a.cmd.Process.Pid); !strings.Contains(line, "in use by another authority") || !strings.Contains(line, want) {
		t.Fatalf("second authority: %q, want it refused naming %s", line, want)
	}
	// The first one is still the one status reaches.
	mustRun(t, "status", "--data", dir)
}
