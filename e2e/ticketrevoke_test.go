package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// pausingProxy forwards TCP connections to a backend. While paused, what
// the backend sends is read but not passed on until it resumes; hook, if
// set, is called as each connection is accepted.
type pausingProxy struct {
	addr string

	mu      sync.Mutex
	backend string
	hook    func()
	gate    chan struct{} // non-nil: paused
}

func startPausingProxy(t *testing.T, backend string) *pausingProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pausingProxy{addr: l.Addr().String(), backend: backend}
	t.Cleanup(func() { l.Close(); p.resume() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *pausingProxy) setBackend(addr string) { p.mu.Lock(); p.backend = addr; p.mu.Unlock() }
func (p *pausingProxy) setHook(f func())       { p.mu.Lock(); p.hook = f; p.mu.Unlock() }

func (p *pausingProxy) pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gate == nil {
		p.gate = make(chan struct{})
	}
}

func (p *pausingProxy) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gate != nil {
		close(p.gate)
		p.gate = nil
	}
}

func (p *pausingProxy) serve(c net.Conn) {
	defer c.Close()
	p.mu.Lock()
	backend, hook := p.backend, p.hook
	p.mu.Unlock()
	if hook != nil {
		hook()
	}
	s, err := net.DialTimeout("tcp", backend, 5*time.Second)
	if err != nil {
		return
	}
	defer s.Close()
	done := make(chan struct{}, 2)
	go func() { io.Copy(s, c); s.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := s.Read(buf)
			if n > 0 {
				p.mu.Lock()
				gate := p.gate
				p.mu.Unlock()
				if gate != nil {
					<-gate
				}
				if _, err := c.Write(buf[:n]); err != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		c.(*net.TCPConn).CloseWrite()
		done <- struct{}{}
	}()
	<-done
	<-done
}

// TestReferralTicketOfARevokedKey: an agent holds a ticket signed by
// discovery's key when an operator revokes that key (muster discovery
// rotate-key --revoke-previous); by the time the ticket reaches the
// authority, the authority has fetched the JWKS without it and refuses the
// ticket for its key (ticket_key_unknown). The agent asks discovery for a
// fresh ticket, signed with the new key, and joins, instead of stopping.
//
// The agent reaches discovery through a proxy that holds discovery's
// answers back from the moment the agent probes the authority (the step
// before it asks for its ticket) until the revocation has reached the
// authority's keys: another agent's join with a ticket of the new key makes
// the authority fetch them.
func TestReferralTicketOfARevokedKey(t *testing.T) {
	t.Parallel()
	adir, init := initDir(t)
	e := &referralEnv{discDir: filepath.Join(t.TempDir(), "discovery"), dir: adir, authorityID: init["authority_id"].(string),
		fingerprint: init["ca_fingerprint"].(string), psk: init["bootstrap_psk"].(string)}
	// The authority fetches discovery's keys as it starts and then only
	// every discovery.keys_refresh, here the longest (10m), which no step
	// below waits for: its fetches are those tickets of key IDs it does
	// not hold cause, so the test knows when the last one was.
	if err := os.WriteFile(filepath.Join(adir, "authority.yaml"), []byte("discovery:\n  keys_refresh: 10m\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.disc = startDiscovery(t, e.discDir, allowing(init)...)
	dproxy := startPausingProxy(t, e.disc.addr)
	aproxy := startPausingProxy(t, "")
	e.auth = startAuthority(t, adir, "--discovery", e.disc.addr, "--discovery-fingerprint", e.disc.fingerprint, "--advertise", aproxy.addr)
	aproxy.setBackend(e.auth.listen)
	e.waitRegistered(t)
	keys := servedKeys(t, e.disc)
	if len(keys) != 1 {
		t.Fatalf("discovery serves keys %v, want one", keys)
	}

	// Agent a: its probe of the authority pauses discovery's answers, so
	// the ticket discovery signs for it next waits in the proxy.
	probed := make(chan struct{})
	var once sync.Once
	aproxy.setHook(func() { once.Do(func() { dproxy.pause(); close(probed) }) })
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	adirA := filepath.Join(t.TempDir(), "a")
	cmd := execCommand(ctx, "agent", "join", "--data", adirA, "--node", "a", "--discovery", dproxy.addr,
		"--discovery-fingerprint", e.disc.fingerprint, "--authority-id", e.authorityID, "--ca-fingerprint", e.fingerprint, "--timeout", "3m")
	cmd.Env = append(cmd.Env, "HOME="+t.TempDir(), "MUSTER_BOOTSTRAP_PSK="+e.psk)
	var aOut lockedBuffer
	cmd.Stdout, cmd.Stderr = &aOut, &aOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	aDone := make(chan error, 1)
	go func() { aDone <- cmd.Wait() }()
	select {
	case <-probed:
	case err := <-aDone:
		t.Fatalf("agent a ended (%v) before it probed the authority:\n%s", err, aOut.String())
	case <-time.After(time.Minute):
		t.Fatalf("agent a did not probe the authority within a minute:\n%s", aOut.String())
	}
	aproxy.setHook(nil)
	for deadline := time.Now().Add(time.Minute); !strings.Contains(metricsOf(t, e.disc.metrics), "muster_discovery_tickets_issued_total 1"); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("discovery issued no ticket for agent a within a minute:\n%s", aOut.String())
		}
	}

	// The key that signed it is revoked, and leaves discovery's JWKS.
	var rev struct {
		Previous string `json:"previous"`
		Active   string `json:"active"`
	}
	out := mustRun(t, "discovery", "rotate-key", "--data", e.discDir, "--revoke-previous", "-o", "json")
	if err := json.Unmarshal([]byte(out), &rev); err != nil || rev.Previous != keys[0] {
		t.Fatalf("rotate-key --revoke-previous printed %q (%v), want %s revoked", out, err, keys[0])
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if got := servedKeys(t, e.disc); len(got) == 1 && got[0] == rev.Active {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("discovery still serves %v 30 s after the revocation, want [%s]", servedKeys(t, e.disc), rev.Active)
		}
	}
	// Agent b joins with a ticket of the new key, which makes the
	// authority fetch the keys: the revoked one is gone from them. (A
	// join that comes before the authority may fetch again is told to
	// retry, 10 s after the last fetch at most; the pause keeps b
	// within discovery's ticket rate.)
	bdir := filepath.Join(t.TempDir(), "b")
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(5 * time.Second) {
		r := e.join(t, bdir, "b", e.psk)
		if r.code == 0 {
			break
		}
		if !strings.Contains(r.stderr, "UNAVAILABLE") || time.Now().After(deadline) {
			t.Fatalf("join of b with a ticket of the new key: exit %d\n%s\nauthority:\n%s", r.code, r.stderr, e.auth.Logs())
		}
	}

	// Agent a's ticket goes on once the authority may fetch the keys
	// again for its key, RefetchAfter (10 s) after its last fetch, so it
	// is refused for its key, not told to retry. The last fetch came
	// before b joined (b's ticket's, or the one at start): 12 s after b's
	// join, and no scheduled fetch until 10 minutes after the start.
	time.Sleep(12 * time.Second)
	dproxy.resume()
	select {
	case err := <-aDone:
		if err != nil {
			t.Fatalf("agent a, whose ticket's key was revoked: %v\n%s\nauthority:\n%s", err, aOut.String(), e.auth.Logs())
		}
	case <-time.After(3 * time.Minute):
		t.Fatalf("agent a did not end within 3 minutes:\n%s", aOut.String())
	}
	st := agentStatus(t, adirA)
	if st["node_id"] != "a" || st["join_method"] != "psk" {
		t.Errorf("agent a's status after the join: %v", st)
	}
	// agent join said it asked for a fresh ticket, once, with the reason.
	if out := aOut.String(); strings.Count(out, "asking discovery for a new one") != 1 || !strings.Contains(out, "reason=ticket_key_unknown") {
		t.Errorf("agent join's output does not log its one retry with a fresh ticket, with the reason ticket_key_unknown:\n%s", out)
	}
	// The authority refused a's first ticket for its key, and took the
	// fresh one.
	audit := auditJoins(t, e.dir)
	if !strings.Contains(audit, "no longer publishes") || !strings.Contains(audit, keys[0]) {
		t.Errorf("the authority's audit log does not record the refusal of a's first ticket naming key %s:\n%s", keys[0], audit)
	}
	m := metricsOf(t, e.auth.metrics)
	for _, want := range []string{`muster_referral_tickets_total{result="invalid"} 1`, `muster_referral_tickets_total{result="ok"} 2`} {
		if !strings.Contains(m, want) {
			t.Errorf("authority metrics lack %s", want)
		}
	}
}
