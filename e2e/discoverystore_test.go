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

// TestDiscoveryOfflineCommandsUseTheRecordedStore: discovery started with
// a PostgreSQL --store records its URL in DIR/discovery.addr, with the
// user and without the password; the commands that work on discovery's
// store (show, audit list and verify, rotate-key) and discovery started
// again open that store with no --store, the password from PGPASSWORD or
// PGPASSFILE, as the authority's do with authority.json's
// (TestOfflineCommandsUseTheRecordedStore). Before, they opened
// DIR/discovery.db, empty or created. Where the recorded URL cannot
// connect they say where the password comes from and name --store; a URL
// recorded without its user asks for --store.
func TestDiscoveryOfflineCommandsUseTheRecordedStore(t *testing.T) {
	t.Parallel()
	url := postgres(t)
	withPassword := strings.Replace(url, "postgres@", "postgres:s3cret@", 1) + "&password=s3cret"
	dir := filepath.Join(t.TempDir(), "discovery")
	startDiscovery(t, dir, "--store", withPassword).stop(t)

	addrFile := filepath.Join(dir, "discovery.addr")
	raw, err := os.ReadFile(addrFile)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), "s3cret") {
		t.Fatalf("discovery.addr holds the store's password:\n%s", raw)
	}
	var rec map[string]any
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatal(err)
	}
	if rec["store"] != url {
		t.Errorf("discovery.addr records the store %v, want %s (the user kept, the password removed)", rec["store"], url)
	}

	keys := func() []any {
		t.Helper()
		var show map[string]any
		if err := json.Unmarshal([]byte(mustRun(t, "discovery", "show", "--data", dir, "-o", "json")), &show); err != nil {
			t.Fatal(err)
		}
		k, _ := show["ticket_keys"].([]any)
		return k
	}
	if n := len(keys()); n != 1 {
		t.Errorf("discovery show without --store lists %d ticket keys, want the 1 discovery made in its store", n)
	}
	mustRun(t, "discovery", "rotate-key", "--data", dir)
	if n := len(keys()); n != 2 {
		t.Errorf("after rotate-key without --store, show lists %d ticket keys, want 2", n)
	}
	if out := mustRun(t, "discovery", "audit", "list", "--data", dir); !strings.Contains(out, "discovery.start") || !strings.Contains(out, "ticket_key.rotate") {
		t.Errorf("discovery audit list without --store does not show discovery's start and the rotation:\n%s", out)
	}
	if out := mustRun(t, "discovery", "audit", "verify", "--data", dir); !strings.Contains(out, "intact") {
		t.Errorf("discovery audit verify without --store:\n%s", out)
	}
	// Started again without --store, discovery serves from the same
	// store: both keys, the rotated one active.
	startDiscovery(t, dir).stop(t)
	if n := len(keys()); n != 2 {
		t.Errorf("after a start without --store, show lists %d ticket keys, want 2", n)
	}
	if _, err := os.Stat(filepath.Join(dir, "discovery.db")); err == nil {
		t.Error("a command without --store created discovery.db")
	}

	setStore := func(u string) {
		t.Helper()
		rec["store"] = u
		b, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(addrFile, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	unreachable := strings.Replace(url, "/"+strings.Split(strings.TrimPrefix(url, "postgres://"), "/")[1], "/no_such_db?sslmode=disable", 1)
	// A database that is down is not a password problem (closedPort).
	down := "postgres://postgres@" + closedPort(t) + "/muster?sslmode=disable"
	for _, c := range []struct {
		store   string
		want    []string
		notWant string
	}{
		{unreachable, []string{"the store " + addrFile + " records", "PGPASSWORD or PGPASSFILE", "--store URL"}, ""},
		{"postgres://…@" + strings.Split(strings.TrimPrefix(url, "postgres://postgres@"), "?")[0], []string{"without its user name", "--store URL"}, ""},
		{down, []string{"the store " + addrFile + " records", "is unavailable", "start the database", "--store URL"}, "PGPASSWORD"},
	} {
		setStore(c.store)
		for _, args := range [][]string{
			{"discovery", "show", "--data", dir},
			{"discovery", "rotate-key", "--data", dir},
			{"discovery", "audit", "verify", "--data", dir},
			{"discovery", "--data", dir, "--listen", "127.0.0.1:0", "--metrics-listen", ""},
		} {
			line := mustFail(t, args...)
			for _, w := range c.want {
				if !strings.Contains(line, w) {
					t.Errorf("muster %s with discovery.addr's store %s: %q, want it to say %q", strings.Join(args, " "), c.store, line, w)
				}
			}
			if c.notWant != "" && strings.Contains(line, c.notWant) {
				t.Errorf("muster %s with discovery.addr's store %s: %q, want it not to name %s", strings.Join(args, " "), c.store, line, c.notWant)
			}
		}
	}
	// --store is the way out each refusal names.
	mustRun(t, "discovery", "audit", "verify", "--data", dir, "--store", url)
}

// TestDiscoveryStoreLostWhileAnAuthorityRuns: discovery's store lost and
// discovery started on a new one, as its refusal says (the way out
// pasted into a shell), while the authority runs on: the authority
// registers again by itself, and agents can look it up. It once waited
// for its next register_every (10 minutes by default), while agents were
// told "not registered"; and the refusal said "remove FILE and FILE".
func TestDiscoveryStoreLostWhileAnAuthorityRuns(t *testing.T) {
	t.Parallel()
	dir, init := initDir(t)
	id := init["authority_id"].(string)
	ddir := filepath.Join(t.TempDir(), "discovery")
	d := startDiscovery(t, ddir, allowing(init)...)
	startAuthority(t, dir, "--discovery", d.addr, "--discovery-fingerprint", d.fingerprint)
	waitLookup(t, d, id)

	d.stop(t)
	dbs, _ := filepath.Glob(filepath.Join(ddir, "discovery.db*"))
	for _, f := range dbs {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	args := append([]string{"discovery", "--data", ddir, "--listen", d.addr, "--metrics-listen", "", "--log-format", "json"}, allowing(init)...)
	r := muster(t, nil, args...)
	const lead = "kept as the evidence of what it removed: "
	_, cmd, ok := strings.Cut(strings.TrimSpace(r.stderr), lead)
	if r.code == 0 || !ok {
		t.Fatalf("discovery on a new store: exit %d, stderr %s; want a way out after %q", r.code, r.stderr, lead)
	}
	if out, err := exec.Command("sh", "-c", cmd).CombinedOutput(); err != nil {
		t.Fatalf("the way out %q pasted: %v: %s", cmd, err, out)
	}
	d = startDiscovery(t, ddir, append(allowing(init), "--listen", d.addr)...)
	// The authority's leader asks every 30 s; the deadline leaves a
	// loaded machine room.
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(time.Second) {
		v, errLine := lookupVersion(t, d, id)
		if v > 0 {
			break
		}
		if !strings.Contains(errLine, "NOT_FOUND") || time.Now().After(deadline) {
			t.Fatalf("lookup after discovery lost its store: %s\n%s", errLine, d.Logs())
		}
	}
}
