package e2e

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
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
		c := dial([]string{"127.0.0.1", "127.0.0.2"}[i%2])
		// Each says something (the start of a TLS record): a connection
		// that has sent nothing would be closed to make room for the next
		// (TestHalfOpenFloodFromManySources).
		if _, err := c.Write([]byte{0x16}); err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	// Each held connection is accepted and read (and waits for the rest
	// of its TLS handshake) before the next is dialled past the cap.
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

// TestHalfOpenFloodFromManySources: with --max-connections 64, eight
// sources each redialling 32 connections that say nothing (each source
// within its per-source cap, together four times the cap) do not keep an
// agent from renewing nor an operator from `muster status`: on a full cap
// a new connection takes the place of the oldest that has sent nothing of
// the source holding the most such, counted as reason="silent". Before,
// the half-open connections held every place for the 10 s handshake
// timeout and were redialled at once; and then, with the oldest silent
// connection of all evicted, a status call slowed between its connect and
// its ClientHello was closed ("authentication handshake failed: EOF").
func TestHalfOpenFloodFromManySources(t *testing.T) {
	e := newAgentEnv(t, "--max-connections", "64")
	adir := filepath.Join(t.TempDir(), "victim")
	if r := muster(t, nil, "agent", "join", "--data", adir, "--node", "victim", e.createToken(t).URI); r.code != 0 {
		t.Fatalf("join: %s", r.stderr)
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() })
	var held atomic.Int64
	for i := range 8 {
		src := net.IPv4(127, 0, 1, byte(10+i))
		for range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: src}}
				for ctx.Err() == nil {
					c, err := d.DialContext(ctx, "tcp", e.auth.addr)
					if err != nil {
						time.Sleep(10 * time.Millisecond)
						continue
					}
					held.Add(1)
					stopped := context.AfterFunc(ctx, func() { c.Close() })
					c.Read(make([]byte, 1)) // says nothing; ends when closed
					stopped()
					held.Add(-1)
					c.Close()
				}
			}()
		}
	}
	time.Sleep(2 * time.Second) // the attack holds what it can
	t.Logf("half-open connections open at the client end: %d", held.Load())
	for i := range 6 {
		if i < 3 {
			if r := muster(t, nil, "agent", "renew", "--data", adir, "--timeout", "5s"); r.code != 0 {
				t.Errorf("renewal %d during the flood: exit %d\n%s", i+1, r.code, r.stderr)
			}
		}
		if r := muster(t, nil, "status", "--data", e.dir, "--timeout", "5s"); r.code != 0 {
			t.Errorf("muster status %d during the flood: exit %d\n%s", i+1, r.code, r.stderr)
		}
	}
	m := metricsOf(t, e.auth.metrics)
	if !strings.Contains(m, `muster_connections_refused_total{listener="api",reason="silent"}`) {
		t.Errorf("no connection closed as silent:\n%s", grepLines(m, "muster_connections_refused_total{"))
	}
	t.Logf("refused: %s", grepLines(m, "muster_connections_refused_total{"))
}
