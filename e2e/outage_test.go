package e2e

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store/pgtest"
)

// TestDatabaseOutage stops the authority's PostgreSQL across an agent's
// renewal window and starts it again. Through the outage the agent keeps
// running (its renewal is answered UNAVAILABLE, retried, never a permanent
// failure) and renews once the database is back; the admin CLI says the
// authority's store is unavailable, not that the authority cannot be
// reached; /metrics still answers; the authority logs the outage in a
// couple of lines, not one per request; and a stream that ended during the
// outage is recorded as ended once the database is back. Its own cluster:
// the test stops it. The database stops as soon as both streams are
// recorded and starts again once the agent's renewal has failed twice, so
// the test waits on the agent, not on a clock: it runs beside others.
func TestDatabaseOutage(t *testing.T) {
	t.Parallel()
	own, url, dir := ownPostgres(t, (*pgtest.Server).Resume)
	e := &agentEnv{dir: dir, auth: startAuthority(t, dir, "--store", url, "--agent-cert-ttl", "24s")}

	run := func(node string) (*proc, string) {
		adir := filepath.Join(t.TempDir(), node)
		if r := muster(t, nil, "agent", "join", "--data", adir, "--node", node, e.createToken(t).URI); r.code != 0 {
			t.Fatalf("agent join %s: exit %d\n%s", node, r.code, r.stderr)
		}
		p, _ := startProc(t, node, "stream to the authority open", "agent", "run", "--data", adir, "--log-format", "json")
		return p, adir
	}
	stayer, sdir := run("stayer")
	leaver, _ := run("leaver")
	waitFor(t, 10*time.Second, "both streams recorded", func() bool {
		out := mustRun(t, "agents", "list", "--data", dir)
		return strings.Count(out, "connected via") == 2
	})
	// The stayer renews at about half of 24 s (±10%): from 10.8 s after
	// its join. The database goes down now, a few seconds after the join,
	// and comes back once that renewal has failed twice.
	if g := agentStatus(t, sdir)["generation"]; g != float64(0) {
		t.Fatalf("renewed before the outage (generation %v): the test's timing does not hold", g)
	}
	if err := own.Halt(); err != nil {
		t.Fatal(err)
	}
	outage := time.Now()
	logsBefore := len(e.auth.Logs())

	// A stream that ends while the database is down.
	leaver.cmd.Process.Signal(syscall.SIGTERM)
	waitFor(t, 10*time.Second, "the leaver stops", func() bool {
		select {
		case <-leaver.done:
			return true
		default:
			return false
		}
	})
	r := muster(t, nil, "agents", "list", "--data", dir)
	if r.code == 0 || strings.Contains(r.stderr, "cannot reach the authority") || !strings.Contains(r.stderr, "UNAVAILABLE: the authority's store is unavailable") {
		t.Errorf("agents list with the database down: exit %d, %q", r.code, r.stderr)
	}
	if m := metricsOf(t, e.auth.metrics); !strings.Contains(m, "muster_store_up 0") || !strings.Contains(m, "muster_rpc_requests_total") {
		t.Errorf("/metrics with the database down:\n%s", grepLines(m, "muster_store_up"))
	}
	waitFor(t, agentReach, "the stayer's renewal fails twice", func() bool {
		return strings.Count(stayer.Logs(), "renewal failed; retrying") >= 2
	})
	t.Logf("the database was down %s", time.Since(outage).Round(100*time.Millisecond))
	if err := own.Resume(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()

	waitFor(t, agentReach, "the stayer renews after the outage", func() bool {
		select {
		case <-stayer.done:
			t.Fatalf("the agent exited during the database outage: %v\n%s", stayer.exitErr, stayer.Logs())
		default:
		}
		return agentStatus(t, sdir)["generation"] == float64(1)
	})
	t.Logf("renewed %s after the database was back", time.Since(back).Round(100*time.Millisecond))
	if l := stayer.Logs(); strings.Contains(l, "permanent failure") || !strings.Contains(l, "renewal failed; retrying") {
		t.Errorf("the agent's log through the outage:\n%s", l)
	}
	waitFor(t, 10*time.Second, "the leaver's stream recorded as ended", func() bool {
		out := mustRun(t, "agents", "show", "leaver", "--data", dir)
		return strings.Contains(out, "Stream: disconnected")
	})
	waitFor(t, 10*time.Second, "the authority logs the store back", func() bool {
		return strings.Contains(e.auth.Logs(), "the store is available again")
	})
	during := e.auth.Logs()[logsBefore:]
	if n := strings.Count(during, `"level":"WARN"`) + strings.Count(during, `"level":"ERROR"`); n > 4 {
		t.Errorf("%d warnings and errors through one outage, want the store lost, the notifications lost and the serving lock lost, each once:\n%s\n%s",
			n, grepLines(during, `"level":"WARN"`), grepLines(during, `"level":"ERROR"`))
	}
	if !strings.Contains(during, "failed_requests") {
		t.Errorf("the store's return does not count the failed requests:\n%s", grepLines(during, "available again"))
	}
}

// TestStreamEndsWithItsCertificate: with 8-second certificates every
// stream ends when the certificate it was opened with expires, about four
// seconds after the agent renewed; the agent reconnects within a second of
// each such end instead of doubling its wait (before, the waits grew to 16
// s and more, and agents went 25 s without a stream).
func TestStreamEndsWithItsCertificate(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t, "--agent-cert-ttl", "8s")
	adir := filepath.Join(t.TempDir(), "agent")
	if r := muster(t, nil, "agent", "join", "--data", adir, "--node", "short", e.createToken(t).URI); r.code != 0 {
		t.Fatalf("agent join: exit %d\n%s", r.code, r.stderr)
	}
	ag, _ := startProc(t, "agent", "stream to the authority open", "agent", "run", "--data", adir, "--log-format", "json")
	waitFor(t, 90*time.Second, "five streams ended with their certificates", func() bool {
		return strings.Count(e.auth.Logs(), "agent stream closed: certificate expired") >= 5
	})
	for _, l := range strings.Split(grepLines(ag.Logs(), "stream to the authority closed"), "\n") {
		var rec struct {
			Msg     string `json:"msg"`
			RetryIn string `json:"retry_in"`
		}
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("agent log line %q: %v", l, err)
		}
		if d, err := time.ParseDuration(rec.RetryIn); err != nil || d > time.Second {
			t.Errorf("after a stream ended with its certificate the agent waits %s:\n%s", rec.RetryIn, grepLines(ag.Logs(), "stream to the authority"))
		}
	}
}

// TestLockRightAfterAnOutage: two replicas on one PostgreSQL, an agent's
// stream on the first; the database is down for 10 s, long enough for the
// replicas' listening connections to give up several times. A lock made
// through the second replica as soon as the database is back closes the
// stream on the first within 2 s: the first listens again within a second
// of the database's return (its backoff capped at 1 s; it grew to 5 s
// before), and then re-checks every stream.
func TestLockRightAfterAnOutage(t *testing.T) {
	own, url, dir := ownPostgres(t, (*pgtest.Server).Resume)
	bdir := replicaDir(t, dir)
	a := startAuthority(t, dir, "--store", url)
	b := startAuthority(t, bdir, "--store", url)
	var tok createdToken
	if err := json.Unmarshal([]byte(mustRun(t, "token", "create", "--data", dir, "--authority", a.addr, "-o", "json")), &tok); err != nil {
		t.Fatal(err)
	}
	adir := filepath.Join(t.TempDir(), "agent")
	if r := muster(t, nil, "agent", "join", "--data", adir, "--node", "n1", tok.URI); r.code != 0 {
		t.Fatalf("join: %s", r.stderr)
	}
	ag, _ := startProc(t, "agent", "stream to the authority open", "agent", "run", "--data", adir, "--log-format", "json")
	waitFor(t, 5*time.Second, "replica a holds the stream", func() bool { return strings.Contains(a.Logs(), "agent stream opened") })

	if err := own.Halt(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Second)
	if err := own.Resume(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("replica a:\n%s", grepLines(a.Logs(), "store"))
			t.Logf("replica a streams:\n%s", grepLines(a.Logs(), "stream"))
		}
	})
	waitFor(t, 10*time.Second, "the lock through b", func() bool {
		return muster(t, nil, "lock", "create", "--data", bdir, "--authority", b.addr, "--node", "n1", "--reason", "test").code == 0
	})
	took := waitFor(t, 2*time.Second, "the stream on a closes after the lock through b", func() bool {
		return strings.Contains(grepLines(a.Logs(), `"msg":"agent stream closed"`), "locked")
	})
	t.Logf("stream on replica a closed %s after the lock through replica b, made as the database came back", took)
	if n := strings.Count(a.Logs(), "lost the store's change notifications"); n != 1 {
		t.Errorf("replica a logged the loss of its notifications %d times in one outage", n)
	}
	if !strings.Contains(a.Logs(), "listening again to the store's change notifications") {
		t.Error("replica a does not log that it listens again")
	}
	waitingOutLock(t, ag)
}

// TestHungDatabase: a database that hangs rather than refusing (every
// process of its cluster stopped: the kernel still accepts connections and
// acknowledges data) is an outage like a stopped one, once the store's own
// deadline (limits.store_timeout, 2 s here) has passed: the admin CLI
// says the store is unavailable, not DEADLINE_EXCEEDED; the authority logs
// the outage once and its end; the agent's renewal is answered
// UNAVAILABLE, retried, and succeeds once the database answers again,
// without a restart. Before the store had a deadline of its own, every
// request waited for its caller's (30 s for an agent's renewal), and the
// outage was never logged.
func TestHungDatabase(t *testing.T) {
	t.Parallel()
	own, url, dir := ownPostgres(t, (*pgtest.Server).Thaw)
	e := &agentEnv{dir: dir, auth: startAuthority(t, dir, "--store", url, "--store-timeout", "2s", "--agent-cert-ttl", "40s")}
	adir := filepath.Join(t.TempDir(), "n1")
	if r := muster(t, nil, "agent", "join", "--data", adir, "--node", "n1", e.createToken(t).URI); r.code != 0 {
		t.Fatalf("agent join: exit %d\n%s", r.code, r.stderr)
	}
	agent, _ := startProc(t, "n1", "stream to the authority open", "agent", "run", "--data", adir, "--log-format", "json")
	waitFor(t, 10*time.Second, "the stream recorded", func() bool {
		return strings.Contains(mustRun(t, "agents", "list", "--data", dir), "connected via")
	})
	// The agent renews at about half of 40 s (±10%): from 18 s after its
	// join; the database hangs from now until that renewal has failed.
	if g := agentStatus(t, adir)["generation"]; g != float64(0) {
		t.Fatalf("renewed before the database hung (generation %v): the test's timing does not hold", g)
	}
	if err := own.Freeze(); err != nil {
		t.Fatal(err)
	}
	hung := time.Now()

	start := time.Now()
	r := muster(t, nil, "agents", "list", "--data", dir)
	t.Logf("agents list with the database hung: %s", time.Since(start).Round(100*time.Millisecond))
	if r.code == 0 || !strings.Contains(r.stderr, "UNAVAILABLE: the authority's store is unavailable") {
		t.Errorf("agents list with the database hung: exit %d, %q", r.code, r.stderr)
	}
	waitFor(t, 30*time.Second, "the authority logs the store unavailable", func() bool {
		return strings.Contains(e.auth.Logs(), "the store is unavailable")
	})
	waitFor(t, 40*time.Second, "the agent's renewal fails", func() bool {
		return strings.Contains(agent.Logs(), "renewal failed; retrying")
	})
	t.Logf("the database hung %s", time.Since(hung).Round(100*time.Millisecond))
	if err := own.Thaw(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	waitFor(t, 20*time.Second, "the agent renews after the database answers again", func() bool {
		select {
		case <-agent.done:
			t.Fatalf("the agent exited while the database hung: %v\n%s", agent.exitErr, agent.Logs())
		default:
		}
		return agentStatus(t, adir)["generation"] == float64(1)
	})
	t.Logf("renewed %s after the database answered again", time.Since(back).Round(100*time.Millisecond))
	waitFor(t, 20*time.Second, "the authority logs the store back", func() bool {
		return strings.Contains(e.auth.Logs(), "the store is available again")
	})
	if l := agent.Logs(); strings.Contains(l, "permanent failure") {
		t.Errorf("the agent's log through the hang:\n%s", l)
	}
}

// ownPostgres starts a PostgreSQL cluster for this test alone, since the
// test stops or freezes it, and inits an authority directory on a
// database in it. At the test's end undo (Resume or Thaw) brings the
// cluster back, so it can be stopped.
func ownPostgres(t *testing.T, undo func(*pgtest.Server) error) (own *pgtest.Server, url, dir string) {
	t.Helper()
	own, err := pgtest.Start()
	if err != nil {
		t.Fatalf("PostgreSQL: %v", err)
	}
	t.Cleanup(func() { undo(own); own.Stop() })
	url = own.NewDatabase(t)
	dir = filepath.Join(t.TempDir(), "authority")
	mustRun(t, "init", "--data", dir, "--store", url)
	return own, url, dir
}
