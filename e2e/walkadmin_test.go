package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAdminAddOutExistsIssuesNothing: admin add to an --out that already
// exists (the default NAME.pem of an expired identity, typically) is
// refused before the authority is asked. It once issued and recorded the
// certificate, then failed writing it: the key was gone, and the name held
// a valid identity nobody had, refused ALREADY_EXISTS without --reissue.
func TestAdminAddOutExistsIssuesNothing(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	startAuthority(t, dir)
	out := filepath.Join(t.TempDir(), "carol.pem")
	if err := os.WriteFile(out, []byte("an old identity\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if line := mustFail(t, "admin", "add", "carol", "--data", dir, "--out", out); !strings.Contains(line, "already exists") || !strings.Contains(line, "--out") {
		t.Errorf("admin add over an existing file: %s", line)
	}
	var recs []map[string]any
	if err := json.Unmarshal([]byte(mustRun(t, "audit", "list", "--data", dir, "-o", "json", "--action", "operator.add")), &recs); err != nil {
		t.Fatal(err)
	}
	for _, rec := range recs {
		if rec["target"] == "carol" {
			t.Errorf("the refused admin add reached the authority: %v", rec)
		}
	}
	// The name is free: the same command with another --out works.
	mustRun(t, "admin", "add", "carol", "--data", dir, "--out", out+".new")
}

// TestAdminAuthorityAddressWithoutPort: an admin command given an
// authority address without a port (--authority or MUSTER_AUTHORITY) says
// so and names the form that works; it once dialed port 443 and said only
// that the authority could not be reached.
func TestAdminAuthorityAddressWithoutPort(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	a := startAuthority(t, dir)
	if line := mustFail(t, "status", "--data", dir, "--authority", "127.0.0.1"); !strings.Contains(line, "--authority \"127.0.0.1\" is not HOST:PORT") || !strings.Contains(line, "--authority 127.0.0.1:7443") {
		t.Errorf("--authority without a port: %s", line)
	}
	r := muster(t, []string{"MUSTER_AUTHORITY=localhost"}, "admin", "list", "--data", dir)
	if r.code == 0 || !strings.Contains(r.stderr, "MUSTER_AUTHORITY \"localhost\" is not HOST:PORT") {
		t.Errorf("MUSTER_AUTHORITY without a port: exit %d, stderr %s", r.code, r.stderr)
	}
	mustRun(t, "status", "--data", dir, "--authority", a.addr)
}
