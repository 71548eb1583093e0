package e2e

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store/pgtest"
)

// TestHAWalkPostgres walks docs/high-availability.md as an operator does,
// out of the happy order: two replicas behind a TCP balancer on one
// PostgreSQL, agents joined by token and by PSK running with short
// certificates; a dump taken while they run ("yesterday's backup"); one
// replica killed with SIGKILL, the agents renewing through the other and
// the replica started again; the database stopped and started under
// them; an agent intermediate rotated after the dump; the database
// restored from the dump with the commands "Backup and restore" gives,
// pasted; and a rolling restart. Its own cluster: the test stops it.
func TestHAWalkPostgres(t *testing.T) {
	t.Parallel()
	own, dbURL, dir := ownPostgres(t, (*pgtest.Server).Resume)
	fp := caFingerprintOf(t, dir)
	lb := startBalancer(t)
	// Each replica keeps its address across restarts, as a balancer's
	// backends do.
	replica := func(d, listen string) *authorityProc {
		t.Helper()
		p := startAuthority(t, d, "--store", dbURL, "--advertise", lb.addr, "--agent-cert-ttl", "24s", "--listen", listen)
		lb.set(d, p.listen)
		return p
	}
	bdir := replicaDir(t, dir)
	a, b := replica(dir, "127.0.0.1:0"), replica(bdir, "127.0.0.1:0")
	at := func(p *authorityProc, args ...string) []string {
		return append(args, "--data", dir, "--authority", p.listen)
	}
	env := &agentEnv{dir: dir, auth: a, fingerprint: fp}

	// Two agents by token, two by PSK, spread over the replicas by the
	// balancer; each runs.
	psk := showPSKs(t, dir).Active.PSK
	agents := map[string]string{} // node: ADIR
	runs := map[string]*proc{}
	run := func(node string) {
		t.Helper()
		runs[node], _ = startProc(t, node, "stream to the authority open", "agent", "run", "--data", agents[node], "--log-format", "json")
	}
	for _, node := range []string{"tok-1", "tok-2", "psk-1", "psk-2"} {
		agents[node] = filepath.Join(t.TempDir(), node)
		if strings.HasPrefix(node, "psk") {
			if r := muster(t, []string{"MUSTER_BOOTSTRAP_PSK=" + psk, "MUSTER_CA_FINGERPRINT=" + fp},
				"agent", "join", "--data", agents[node], "--node", node, "--authority", lb.addr); r.code != 0 {
				t.Fatalf("PSK join of %s: %s", node, r.stderr)
			}
		} else if r := muster(t, []string{"MUSTER_JOIN_URI=" + env.createToken(t, "--node", node).URI}, "agent", "join", "--data", agents[node]); r.code != 0 {
			t.Fatalf("token join of %s: %s", node, r.stderr)
		}
		run(node)
	}
	// -1 when agent status fails: read while the agent replaces its
	// files, say; the callers wait and ask again.
	generation := func(node string) float64 {
		r := muster(t, nil, "agent", "status", "--data", agents[node], "-o", "json")
		var st struct{ Generation float64 }
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil {
			t.Logf("agent status of %s: exit %d: %s", node, r.code, r.stderr)
			return -1
		}
		return st.Generation
	}
	renewedPast := func(what string, past map[string]float64) {
		t.Helper()
		waitFor(t, agentReach, what, func() bool {
			for node, g := range past {
				if generation(node) <= g {
					return false
				}
			}
			return true
		})
	}
	generations := func() map[string]float64 {
		g := map[string]float64{}
		for node := range runs {
			g[node] = generation(node)
		}
		return g
	}

	// Yesterday's backup, taken while the replicas run, as the docs say;
	// a token created before it is used after it.
	late := env.createToken(t, "--node", "late")
	dump := filepath.Join(t.TempDir(), "muster.dump")
	pgClient(t, "pg_dump", "-Fc", "-d", dbURL, "-f", dump)
	agents["late"] = filepath.Join(t.TempDir(), "late")
	if r := muster(t, []string{"MUSTER_JOIN_URI=" + late.URI}, "agent", "join", "--data", agents["late"]); r.code != 0 {
		t.Fatalf("join of late: %s", r.stderr)
	}
	lateRun, _ := startProc(t, "late", "stream to the authority open", "agent", "run", "--data", agents["late"], "--log-format", "json")
	// An agent intermediate prepared after the backup (activated below,
	// once every replica has published it).
	mustRun(t, at(b, "ca", "rotate", "agent")...)

	// One replica killed under the agents: they renew through the other.
	before := generations()
	a.cmd.Process.Kill()
	<-a.done
	renewedPast("every agent renews with replica A killed", before)
	a = replica(dir, a.listen)
	if out := mustRun(t, at(a, "agents", "list")...); strings.Count(out, "connected via "+lb.addr) < 4 {
		t.Errorf("agents list after the restart of replica A:\n%s", out)
	}
	// Refused until every replica has published it (10 s in the store).
	waitFor(t, agentReach, "the prepared intermediate activates", func() bool {
		return muster(t, nil, at(a, "ca", "rotate", "agent", "--activate")...).code == 0
	})
	activated := generations()

	// The database stopped under both: operator commands through either
	// replica say the store is unavailable, not the authority; a
	// single-use token tried meanwhile is used once, after.
	once := env.createToken(t, "--node", "once")
	onceDir := filepath.Join(t.TempDir(), "once")
	joinOnce := func() result {
		return muster(t, []string{"MUSTER_JOIN_URI=" + once.URI}, "agent", "join", "--force", "--data", onceDir)
	}
	if err := own.Halt(); err != nil {
		t.Fatal(err)
	}
	if r := joinOnce(); r.code == 0 || !strings.Contains(r.stderr, "UNAVAILABLE: the authority's store is unavailable") {
		t.Errorf("a join with the database down: exit %d, %q", r.code, r.stderr)
	}
	for _, p := range []*authorityProc{a, b} {
		if line := mustFail(t, at(p, "lock", "create", "--node", "tok-1")...); !strings.Contains(line, "UNAVAILABLE: the authority's store is unavailable") {
			t.Errorf("lock create through %s with the database down: %q", p.listen, line)
		}
		if code := readyz(t, p.metrics); code != http.StatusServiceUnavailable {
			t.Errorf("/readyz of %s with the database down: %d, want 503", p.listen, code)
		}
	}
	if err := own.Resume(); err != nil {
		t.Fatal(err)
	}
	// "retry later": the first requests after the restart may meet a
	// connection the restart cut.
	waitFor(t, agentReach, "a join with the single-use token after the outage", func() bool {
		r := joinOnce()
		if r.code != 0 && !strings.Contains(r.stderr, "store is unavailable") {
			t.Fatalf("the single-use token after the outage: %s", r.stderr)
		}
		return r.code == 0
	})
	// Another pooled connection the restart cut may still answer
	// "retry later" once; the refusal that matters is "no uses left".
	waitFor(t, agentReach, "the single-use token refused when used again", func() bool {
		r := joinOnce()
		if r.code == 0 || r.code != 0 && !strings.Contains(r.stderr, "store is unavailable") && !strings.Contains(r.stderr, "no uses left") {
			t.Fatalf("the single-use token used again: exit %d, %q", r.code, r.stderr)
		}
		return strings.Contains(r.stderr, "no uses left")
	})
	renewedPast("every agent renews under the new intermediate after the outage", activated)

	// Restore yesterday's backup, the steps of "Backup and restore" as
	// given: stop every replica, replace the database, restore the dump.
	a.stop(t)
	b.stop(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	db := strings.TrimPrefix(u.Path, "/")
	host := []string{"-h", u.Hostname(), "-p", u.Port(), "-U", "postgres"}
	pgClient(t, "dropdb", append(host, db)...)
	pgClient(t, "createdb", append(host, "-O", "postgres", db)...)
	pgClient(t, "pg_restore", "-d", dbURL, "--no-owner", "--exit-on-error", "--single-transaction", dump)
	// A replica that appended after the dump refuses, naming both files;
	// moved aside, it starts.
	r := muster(t, nil, "authority", "--data", bdir, "--store", dbURL, "--listen", "127.0.0.1:0", "--metrics-listen", "")
	if r.code == 0 || !strings.Contains(r.stderr, "the chain lost records") || !strings.Contains(r.stderr, "audit-checkpoint.json") {
		t.Fatalf("a replica on the restored database: exit %d, %q", r.code, r.stderr)
	}
	for _, d := range []string{dir, bdir} {
		aside := d + "-before-restore"
		if err := os.MkdirAll(aside, 0o700); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"audit-head", "audit-checkpoint.json"} {
			if err := os.Rename(filepath.Join(d, f), filepath.Join(aside, f)); err != nil {
				t.Fatal(err)
			}
		}
	}
	a, b = replica(dir, a.listen), replica(bdir, b.listen)
	if out := mustRun(t, at(a, "audit", "verify")...); !strings.Contains(out, "intact") {
		t.Fatalf("audit verify after the restore: %s", out)
	}

	// Agents whose certificates the restored store does not know stop,
	// each naming the join that brings it back with its own directory:
	// late joined after the dump; the others renewed under an
	// intermediate prepared after it.
	for node, p := range map[string]*proc{"late": lateRun, "tok-1": runs["tok-1"], "psk-1": runs["psk-1"]} {
		waitFor(t, agentReach, node+" stops on the restored store", func() bool {
			select {
			case <-p.done:
				return true
			default:
				return false
			}
		})
		join := "muster agent join --force --data " + agents[node] + " --node " + node + " with a joining URI from muster token create --node " + node
		if !strings.Contains(p.Logs(), join) {
			t.Errorf("%s stopped without naming %q:\n%s", node, join, p.Logs())
		}
	}
	// The way out, pasted, brings one back.
	if r := muster(t, []string{"MUSTER_JOIN_URI=" + env.createToken(t, "--node", "tok-1").URI},
		"agent", "join", "--force", "--data", agents["tok-1"], "--node", "tok-1"); r.code != 0 {
		t.Fatalf("the join the refusal names: %s", r.stderr)
	}
	run("tok-1")
	// The single-use token used after the dump has its use back, as the
	// docs warn: deleting it is the way out.
	if out := mustRun(t, at(a, "token", "get", late.ID)...); !strings.Contains(out, "active") {
		t.Errorf("the token used after the dump, on the restored store:\n%s", out)
	}
	mustRun(t, at(b, "token", "delete", late.ID)...)

	// A rolling restart, one replica at a time, each ready before the
	// next: the agent keeps renewing.
	past := map[string]float64{"tok-1": generation("tok-1")}
	a.stop(t)
	a = replica(dir, a.listen)
	waitFor(t, 10*time.Second, "replica A ready", func() bool { return readyz(t, a.metrics) == http.StatusOK })
	b.stop(t)
	b = replica(bdir, b.listen)
	waitFor(t, 10*time.Second, "replica B ready", func() bool { return readyz(t, b.metrics) == http.StatusOK })
	renewedPast("tok-1 renews across the rolling restart", past)
	// Operator commands through each replica, after it all.
	for _, p := range []*authorityProc{a, b} {
		mustRun(t, at(p, "token", "create", "--node", "after")...)
		mustRun(t, at(p, "signer", "list")...)
	}
}

// readyz is the status code of /readyz at addr (0 if it does not answer).
func readyz(t *testing.T, addr string) int {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// pgClient runs a PostgreSQL client program (pg_dump, pg_restore,
// createdb, dropdb) from the server's directory, else from PATH.
func pgClient(t *testing.T, prog string, args ...string) {
	t.Helper()
	path := ""
	if bin, err := pgtest.BinDir(); err == nil {
		if _, err := os.Stat(filepath.Join(bin, prog)); err == nil {
			path = filepath.Join(bin, prog)
		}
	}
	if path == "" {
		p, err := exec.LookPath(prog)
		if err != nil {
			t.Fatalf("%s: %v (it comes with PostgreSQL's client programs)", prog, err)
		}
		path = p
	}
	if out, err := exec.Command(path, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", prog, strings.Join(args, " "), err, out)
	}
}

// balancer is a TCP load balancer (layer 4, as docs/high-availability.md
// asks): each connection goes to the next backend in turn, or to the one
// after if that refuses.
type balancer struct {
	addr     string
	mu       sync.Mutex
	backends map[string]string // by replica directory
	next     int
}

func startBalancer(t *testing.T) *balancer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lb := &balancer{addr: l.Addr().String(), backends: map[string]string{}}
	var conns sync.WaitGroup
	t.Cleanup(func() { l.Close(); conns.Wait() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer conns.Done()
				lb.serve(c)
			}()
		}
	}()
	return lb
}

// set names the replica of directory d at addr.
func (lb *balancer) set(d, addr string) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	lb.backends[d] = addr
}

func (lb *balancer) serve(c net.Conn) {
	defer c.Close()
	lb.mu.Lock()
	var addrs []string
	for _, a := range lb.backends {
		addrs = append(addrs, a)
	}
	lb.next++
	start := lb.next
	lb.mu.Unlock()
	for i := range addrs {
		s, err := net.DialTimeout("tcp", addrs[(start+i)%len(addrs)], 2*time.Second)
		if err != nil {
			continue
		}
		defer s.Close()
		done := make(chan struct{}, 2)
		go func() { io.Copy(s, c); s.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
		go func() { io.Copy(c, s); c.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
		<-done
		<-done
		return
	}
}
