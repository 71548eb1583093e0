package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
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

// TestExpiredOperatorWaysOutPasted: the two ways back an expired operator
// is shown work pasted as they are: another operator's admin add, and the
// break-glass admin add --offline with the data directory the command was
// given, each writing beside the expired file. They once named only the
// break-glass, with --data DIR and no --out: pasted, the placeholder was
// refused, and with it filled in the default --out NAME.pem was the
// expired file itself, which admin add never overwrites.
func TestExpiredOperatorWaysOutPasted(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	startAuthority(t, dir)
	ids := t.TempDir()
	for _, name := range []string{"dave", "erin"} {
		mustRun(t, "admin", "add", name, "--ttl", "1s", "--out", filepath.Join(ids, name+".pem"), "--data", dir)
	}
	var dave, erin result
	deadline := time.Now().Add(30 * time.Second)
	for {
		dave = muster(t, nil, "status", "--data", dir, "--identity", filepath.Join(ids, "dave.pem"))
		erin = muster(t, nil, "admin", "list", "--data", dir, "--identity", filepath.Join(ids, "erin.pem"))
		expired := strings.Contains(dave.stderr, "expired at") && strings.Contains(erin.stderr, "expired at")
		if dave.code != 0 && erin.code != 0 && expired || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The warning each printed (its first line) names both commands.
	pasted := func(r result, prefix string) []string {
		t.Helper()
		warning := strings.SplitN(r.stderr, "\n", 2)[0]
		_, rest, ok := strings.Cut(warning, prefix)
		if !ok {
			t.Fatalf("no %q in the expired operator's warning: %s", prefix, r.stderr)
		}
		cmd, _, _ := strings.Cut(rest, ", or,")
		return strings.Fields(cmd)
	}
	if !strings.Contains(dave.stderr, "UNAUTHENTICATED") {
		t.Fatalf("an expired operator: exit %d, stderr %s", dave.code, dave.stderr)
	}
	// Another operator: the first one, with its own identity (the data
	// directory's operator.pem).
	mustRun(t, append(pasted(dave, "issues a new one with muster "), "--data", dir)...)
	mustRun(t, "status", "--data", dir, "--identity", filepath.Join(ids, "dave-new.pem"))
	// Break-glass, beside the running authority.
	mustRun(t, pasted(erin, "where the authority's data directory is, muster ")...)
	mustRun(t, "admin", "list", "--data", dir, "--identity", filepath.Join(ids, "erin-new.pem"))
	if out := mustRun(t, "audit", "verify", "--data", dir); !strings.Contains(out, "intact") {
		t.Errorf("audit verify: %s", out)
	}
}

// TestTwoAuthoritiesOneSQLiteStore: a second authority on the SQLite file
// another runs on, from a copy of its data directory given --store, is
// refused, naming the store and the first one's pid. It once started,
// and both led the background jobs (unelected on SQLite) on one store.
func TestTwoAuthoritiesOneSQLiteStore(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	copyDir := filepath.Join(t.TempDir(), "copy")
	if out, err := exec.Command("cp", "-a", dir, copyDir).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	a := startAuthority(t, dir)
	r := muster(t, nil, "authority", "--data", copyDir, "--store", "sqlite://"+filepath.Join(dir, "muster.db"),
		"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--log-format", "json")
	if r.code == 0 || !strings.Contains(r.stderr, "in use by another authority (pid ") || !strings.Contains(r.stderr, "the SQLite store is in use") || !strings.Contains(r.stderr, filepath.Join(dir, "muster.db")) {
		t.Fatalf("a second authority on one SQLite store: exit %d, stderr %s", r.code, r.stderr)
	}
	// Stopped, the first one leaves the store to the other.
	a.stop(t)
	startAuthority(t, copyDir, "--store", "sqlite://"+filepath.Join(dir, "muster.db"))
}

// TestAdminTimeoutNotPositive: --timeout 0s (or negative) on an admin
// command is refused naming the flag; it was sent as a deadline already
// passed and reported as the authority's DEADLINE_EXCEEDED.
func TestAdminTimeoutNotPositive(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	startAuthority(t, dir)
	for _, v := range []string{"0s", "-1s"} {
		if line := mustFail(t, "admin", "list", "--data", dir, "--timeout", v); !strings.Contains(line, "--timeout "+v+": give a positive duration") {
			t.Errorf("--timeout %s: %s", v, line)
		}
	}
	mustRun(t, "admin", "list", "--data", dir, "--timeout", "10s")
}

// TestLockedOperatorToldWhoLiftsIt: a locked operator's every command is
// refused with the lock named as a lock on it and who lifts it; it was
// told only "PERMISSION_DENIED: locked". The lock lifted, it works again.
func TestLockedOperatorToldWhoLiftsIt(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	startAuthority(t, dir)
	frank := filepath.Join(t.TempDir(), "frank.pem")
	mustRun(t, "admin", "add", "frank", "--data", dir, "--out", frank)
	var lock map[string]any
	if err := json.Unmarshal([]byte(mustRun(t, "lock", "create", "--admin", "frank", "--reason", "walk", "--data", dir, "-o", "json")), &lock); err != nil {
		t.Fatal(err)
	}
	line := mustFail(t, "status", "--data", dir, "--identity", frank)
	if !strings.Contains(line, "PERMISSION_DENIED: locked; a lock on the operator frank") || !strings.Contains(line, "muster lock list") {
		t.Fatalf("a locked operator: %s", line)
	}
	id, _ := lock["id"].(string)
	if out := mustRun(t, "lock", "list", "--data", dir); id == "" || !strings.Contains(out, id) {
		t.Fatalf("lock list (%q): %s", id, out)
	}
	mustRun(t, "lock", "delete", id, "--data", dir)
	mustRun(t, "status", "--data", dir, "--identity", frank)
}

// TestOfflineWithoutDataDirectory: an offline command run without --data
// (or with a mistyped one) says to give the authority's data directory
// before it offers muster init, which would make another authority: it
// once named only muster init --data muster-data.
func TestOfflineWithoutDataDirectory(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "typo")
	for _, args := range [][]string{
		{"audit", "verify", "--offline", "--data", missing},
		{"audit", "list", "--offline", "--data", missing},
		{"admin", "add", "gina", "--offline", "--data", missing, "--out", filepath.Join(t.TempDir(), "gina.pem")},
	} {
		if line := mustFail(t, args...); !strings.Contains(line, "give the authority's data directory with --data DIR (or MUSTER_DATA)") {
			t.Errorf("muster %s: %s", strings.Join(args, " "), line)
		}
	}
}
