package e2e

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The commands that read an authority's data directory without the
// authority (admin add --offline, audit list and verify --offline, ca
// rotate --offline, and the authority itself) open a PostgreSQL store with no --store: authority.json
// records its URL with the user and without the password, which the
// driver reads from PGPASSWORD or PGPASSFILE. Where that URL cannot
// connect, they say where the password comes from and name --store; a
// URL recorded without its user (older inits) asks for --store.
func TestOfflineCommandsUseTheRecordedStore(t *testing.T) {
	t.Parallel()
	url := postgres(t)
	withPassword := strings.Replace(url, "postgres@", "postgres:s3cret@", 1) + "&password=s3cret"
	dir := filepath.Join(t.TempDir(), "authority")
	if out := mustRun(t, "init", "--data", dir, "--store", withPassword); strings.Contains(out, "s3cret") {
		t.Errorf("init printed the store's password:\n%s", out)
	}
	infoFile := filepath.Join(dir, "authority.json")
	raw, err := os.ReadFile(infoFile)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), "s3cret") {
		t.Fatalf("authority.json holds the store's password:\n%s", raw)
	}
	var info map[string]any
	if err := json.Unmarshal(raw, &info); err != nil {
		t.Fatal(err)
	}
	if info["store"] != url {
		t.Errorf("authority.json records the store %v, want %s (the user kept, the password removed)", info["store"], url)
	}

	mustRun(t, "admin", "add", "breakglass", "--offline", "--data", dir, "--out", filepath.Join(t.TempDir(), "bg.pem"))
	if out := mustRun(t, "audit", "list", "--offline", "--data", dir, "--action", "operator.add"); !strings.Contains(out, "breakglass") {
		t.Errorf("audit list --offline without --store does not show the break-glass operator:\n%s", out)
	}
	if out := mustRun(t, "audit", "verify", "--offline", "--data", dir); !strings.Contains(out, "intact") {
		t.Errorf("audit verify --offline without --store:\n%s", out)
	}
	startAuthority(t, dir).stop(t)
	if _, err := os.Stat(filepath.Join(dir, "muster.db")); err == nil {
		t.Error("a command without --store created muster.db")
	}

	setStore := func(u string) {
		t.Helper()
		info["store"] = u
		b, err := json.Marshal(info)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(infoFile, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	unreachable := strings.Replace(url, "/"+strings.Split(strings.TrimPrefix(url, "postgres://"), "/")[1], "/no_such_db?sslmode=disable", 1)
	// A database that is down (nothing listens on its port) is not a
	// password problem: the refusal says it is unavailable, not where the
	// password comes from (it did, when the database was stopped).
	down := "postgres://postgres@" + closedPort(t) + "/muster?sslmode=disable"
	for _, c := range []struct {
		store   string
		want    []string
		notWant string
	}{
		{unreachable, []string{"the store authority.json records", "PGPASSWORD or PGPASSFILE", "--store URL"}, ""},
		{"postgres://…@" + strings.Split(strings.TrimPrefix(url, "postgres://postgres@"), "?")[0], []string{"recorded without its user name", "--store URL"}, ""},
		{down, []string{"the store authority.json records", "is unavailable", "start the database", "--store URL"}, "PGPASSWORD"},
	} {
		setStore(c.store)
		for _, args := range [][]string{
			{"admin", "add", "other", "--offline", "--data", dir, "--out", filepath.Join(t.TempDir(), "o.pem")},
			{"audit", "list", "--offline", "--data", dir},
			{"audit", "verify", "--offline", "--data", dir},
			{"ca", "rotate", "agent", "--offline", "--data", dir},
			{"authority", "--data", dir, "--listen", "127.0.0.1:0", "--metrics-listen", ""},
		} {
			line := mustFail(t, args...)
			for _, w := range c.want {
				if !strings.Contains(line, w) {
					t.Errorf("muster %s with authority.json's store %s: %q, want it to say %q", strings.Join(args, " "), c.store, line, w)
				}
			}
			if c.notWant != "" && strings.Contains(line, c.notWant) {
				t.Errorf("muster %s with authority.json's store %s: %q, want it not to name %s", strings.Join(args, " "), c.store, line, c.notWant)
			}
		}
	}
	// Given with --store (or MUSTER_STORE, as replicas are), a store that
	// is down is named unavailable too, without the URL's password.
	line := mustFail(t, "audit", "list", "--offline", "--data", dir, "--store", strings.Replace(down, "postgres@", "postgres:s3cret@", 1))
	if !strings.Contains(line, "is unavailable") || !strings.Contains(line, "start the database") || strings.Contains(line, "s3cret") {
		t.Errorf("audit list --offline --store with the database down: %q", line)
	}
	// --store is the way out each refusal names.
	mustRun(t, "admin", "add", "other", "--offline", "--data", dir, "--store", url, "--out", filepath.Join(t.TempDir(), "o.pem"))
}

// closedPort returns a loopback HOST:PORT nothing listens on: one the OS
// handed out a moment ago and that was closed at once.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}
