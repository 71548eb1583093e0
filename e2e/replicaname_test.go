package e2e

import (
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// forwarder is a layer-4 balancer for one test: it passes each new
// connection to the backend set last.
type forwarder struct {
	addr    string
	backend atomic.Pointer[string]
}

func newForwarder(t *testing.T) *forwarder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	f := &forwarder{addr: ln.Addr().String()}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b, err := net.Dial("tcp", *f.backend.Load())
				if err != nil {
					return
				}
				defer b.Close()
				go func() { _, _ = io.Copy(b, c); b.(*net.TCPConn).CloseWrite() }()
				_, _ = io.Copy(c, b)
			}()
		}
	}()
	return f
}

// TestAgentsListTellsReplicasApart: two replicas behind one balancer,
// both with its address as --advertise (docs/high-availability.md), each
// holding one agent's stream. muster agents list names the replica that
// holds each stream by its host and bound address besides the advertised
// one (before, both read "connected via" the balancer's address, the same
// for every replica).
func TestAgentsListTellsReplicasApart(t *testing.T) {
	t.Parallel()
	url := postgres(t)
	dir := filepath.Join(t.TempDir(), "authority")
	mustRun(t, "init", "--data", dir, "--store", url)
	lb := newForwarder(t)
	var bound []string
	for i, d := range []string{dir, replicaDir(t, dir)} {
		_, rec := startProc(t, "replica "+string(rune('a'+i)), "authority started", "authority", "--data", d, "--store", url,
			"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--advertise", lb.addr, "--log-format", "json")
		listen, _ := rec["listen"].(string)
		bound = append(bound, listen)
	}
	e := &agentEnv{dir: dir}
	for i, node := range []string{"on-a", "on-b"} {
		lb.backend.Store(&bound[i])
		adir := joinAgent(t, e, node)
		startProc(t, node, "stream to the authority open", "agent", "run", "--data", adir, "--log-format", "json")
	}
	var list string
	waitFor(t, agentReach, "both streams are listed", func() bool {
		list = mustRun(t, "agents", "list", "--data", dir, "--authority", bound[0])
		return strings.Count(list, "connected via") == 2
	})
	for i, node := range []string{"on-a", "on-b"} {
		want := "at " + bound[i] + ")"
		for _, line := range strings.Split(list, "\n") {
			if strings.HasPrefix(line, node+" ") && !strings.Contains(line, want) {
				t.Fatalf("%s's stream, held by the replica bound to %s, is listed as\n%s", node, bound[i], line)
			}
		}
	}
}
