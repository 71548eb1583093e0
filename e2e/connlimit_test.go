package e2e

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestConnectionsInAllAreCapped: with limits.max_connections set, the API
// listener holds that many connections from all sources together; the
// next is closed at once (not left waiting), counted in
// muster_connections_refused_total and logged once; a place freed is
// taken again, and --check-config prints the cap in force.
func TestConnectionsInAllAreCapped(t *testing.T) {
	dir, _ := initDir(t)
	if err := os.WriteFile(filepath.Join(dir, "authority.yaml"), []byte("limits:\n  max_connections: 6\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := mustRun(t, "authority", "--data", dir, "--check-config"); !strings.Contains(out, "limits.max_connections: 6 (api and bootstrap listeners together)\n") {
		t.Errorf("--check-config does not print the cap:\n%s", out)
	}
	if msg := mustFail(t, "authority", "--data", dir, "--check-config", "--max-connections", "-1"); !strings.Contains(msg, "limits.max_connections -1") {
		t.Errorf("a negative cap: %q", msg)
	}
	a := startAuthority(t, dir)
	if !strings.Contains(a.Logs(), `"max_connections":6,"open_file_limit":"`) {
		t.Errorf("the start log does not name the cap:\n%s", a.Logs())
	}
	// The sources are 127.0.0.1 and 127.0.0.2: the cap is across them.
	dial := func(src string) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		c, err := d.Dial("tcp", a.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	var held []net.Conn
	for i := range 6 {
		held = append(held, dial([]string{"127.0.0.1", "127.0.0.2"}[i%2]))
	}
	// Each held connection is accepted (and waits for its TLS handshake)
	// before the next is dialled past the cap.
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	if !closedAtOnce(dial("127.0.0.2")) {
		t.Fatal("a connection past the cap was not closed at once")
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("the refused connection took %s to close", d)
	}
	waitFor(t, 5*time.Second, "the refusal is counted", func() bool {
		return strings.Contains(metricsOf(t, a.metrics), `muster_connections_refused_total{listener="api",reason="total"} 1`)
	})
	if n := strings.Count(a.Logs(), "the listener holds its cap of open connections"); n != 1 {
		t.Errorf("%d log lines of refusals, want 1:\n%s", n, a.Logs())
	}
	// A CLI call waits for a place: with every place held it fails.
	if r := muster(t, nil, "status", "--data", dir, "--timeout", "2s"); r.code == 0 {
		t.Errorf("status succeeded with every connection place held")
	}
	for _, c := range held[:3] {
		c.Close()
	}
	waitFor(t, 5*time.Second, "a freed place serves a call again", func() bool {
		return muster(t, nil, "status", "--data", dir).code == 0
	})
}
