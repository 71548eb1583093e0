package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// replicaDir copies an authority's files for another replica, as a
// Kubernetes Secret would hand every replica the same CA and storage key.
// The embedded database is not copied: replicas share PostgreSQL.
func replicaDir(t *testing.T, from string) string {
	t.Helper()
	to := filepath.Join(t.TempDir(), "replica")
	if out, err := exec.Command("cp", "-a", from, to).CombinedOutput(); err != nil {
		t.Fatalf("copy %s: %v\n%s", from, err, out)
	}
	os.Remove(filepath.Join(to, "authority.addr"))
	return to
}

// startReplicas initialises an authority on a fresh PostgreSQL database and
// starts n replicas of it, each from its own copy of the directory. It
// returns the database's URL and the replicas.
func startReplicas(t *testing.T, n int) (string, []*agentEnv) {
	t.Helper()
	url := postgres(t)
	dir := filepath.Join(t.TempDir(), "authority")
	mustRun(t, "init", "--data", dir, "--store", url)
	fp := caFingerprintOf(t, dir)
	var replicas []*agentEnv
	for i := range n {
		d := dir
		if i > 0 {
			d = replicaDir(t, dir)
		}
		replicas = append(replicas, &agentEnv{dir: d, auth: startAuthority(t, d, "--store", url), fingerprint: fp})
	}
	return url, replicas
}

// TestReplicasShareOnePostgres: three authority processes on one database.
// What must happen once happens once across them, and what one replica
// writes the others enforce at once.
func TestReplicasShareOnePostgres(t *testing.T) {
	t.Parallel()
	url, started := startReplicas(t, 3)
	var replicas []*joinEnv
	for _, r := range started {
		e := &joinEnv{dir: r.dir, auth: r.auth}
		e.setup(t)
		replicas = append(replicas, e)
	}

	// Concurrent joins on a 5-use token, spread over the replicas: 5.
	tok := replicas[0].token(t, "--uses", "5")
	const n = 24
	results := make(chan codes.Code, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, csr := newCSR(t)
			_, err := replicas[i%3].boot.ExchangeJoinToken(context.Background(), &musterv1.ExchangeJoinTokenRequest{
				JoinToken: tok, NodeId: "node-" + string(rune('a'+i)), Csr: csr})
			results <- status.Code(err)
		}()
	}
	wg.Wait()
	close(results)
	got := map[codes.Code]int{}
	for c := range results {
		got[c]++
	}
	if got[codes.OK] != 5 || got[codes.FailedPrecondition] != n-5 {
		t.Fatalf("joins over three replicas: %v, want 5 OK and %d FAILED_PRECONDITION", got, n-5)
	}

	// A lock made through one replica is enforced by another at once.
	id, _ := replicas[0].join(t, replicas[0].token(t), "locked-node")
	mustRun(t, "lock", "create", "--node", "locked-node", "--data", replicas[1].dir, "--authority", replicas[1].auth.addr)
	_, err := replicas[2].renew(t, id, must2(newCSR(t)))
	wantCode(t, err, codes.PermissionDenied, "locked")

	// A node deleted through one replica cannot renew through another.
	id2, _ := replicas[1].join(t, replicas[1].token(t), "doomed")
	mustRun(t, "agents", "delete", "doomed", "--data", replicas[2].dir, "--authority", replicas[2].auth.addr)
	_, err = replicas[0].renew(t, id2, must2(newCSR(t)))
	wantCode(t, err, codes.PermissionDenied, "deleted")

	// One chain, written by three processes, verifies from each.
	for _, r := range replicas {
		if out := mustRun(t, "audit", "verify", "--data", r.dir, "--authority", r.auth.addr); !strings.Contains(out, "intact") {
			t.Fatalf("audit verify through %s: %s", r.auth.addr, out)
		}
	}
	// Each replica signs a last checkpoint as it stops; the checkpoints of
	// all three still verify against the one chain.
	for _, r := range replicas {
		r.auth.stop(t)
	}
	again := startAuthority(t, replicas[1].dir, "--store", url)
	if out := mustRun(t, "audit", "verify", "--data", replicas[1].dir, "--authority", again.addr); !strings.Contains(out, "intact") {
		t.Fatalf("audit verify after the replicas stopped: %s", out)
	}
}

// TestLeaderFailover: background jobs (token cleaner, audit checkpoints)
// run on one replica; killing it moves them to another.
func TestLeaderFailover(t *testing.T) {
	t.Parallel()
	_, rs := startReplicas(t, 2)
	a, b := rs[0].auth, rs[1].auth
	leading := func(p *authorityProc) bool { return strings.Contains(p.Logs(), `"msg":"leading background jobs"`) }
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s within 20s\nA:\n%s\nB:\n%s", what, a.Logs(), b.Logs())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitFor("a leader", func() bool { return leading(a) || leading(b) })
	leader, follower := a, b
	if leading(b) {
		leader, follower = b, a
	}
	time.Sleep(3 * time.Second) // a follower polls and stays a follower
	if leading(follower) {
		t.Fatal("two replicas lead at once")
	}
	leader.cmd.Process.Kill()
	<-leader.done
	waitFor("the follower to take the lead", func() bool { return leading(follower) })
}

// TestReplicasSharePSKRotation: a PSK rotated through one replica is
// honoured by the others at once, the old one during its grace only, and
// refused by every replica once the grace has ended.
func TestReplicasSharePSKRotation(t *testing.T) {
	t.Parallel()
	_, replicas := startReplicas(t, 3)
	dir := replicas[0].dir
	old := showPSKs(t, dir).Active.PSK
	// Long enough for two joins with other tests running beside this
	// one (4 s was not, on two shared cores): what is checked is that the
	// grace holds and then ends on every replica, not its length.
	const grace = 30 * time.Second
	rot := rotatePSK(t, replicas[0].dir, "--grace", grace.String())
	ends := time.Now().Add(grace)

	// During the grace: the new PSK on replica 2, the old one on replica 3.
	mustPSKJoin(t, replicas[1], "new-on-2", rot.Active.PSK)
	mustPSKJoin(t, replicas[2], "old-on-3", old)
	if a := auditJoins(t, dir); !strings.Contains(a, "(grace)") {
		t.Errorf("the old PSK's join is not recorded as grace:\n%s", a)
	}
	// After it, by the database's clock, the old PSK is refused by every
	// replica, and the new one still joins.
	time.Sleep(time.Until(ends) + time.Second)
	for i, e := range replicas {
		node := "old-after-" + string(rune('1'+i))
		wantJoinFailure(t, pskJoin(t, e, filepath.Join(t.TempDir(), node), node, old, e.fingerprint), "PERMISSION_DENIED", "does not match")
	}
	mustPSKJoin(t, replicas[2], "new-on-3", rot.Active.PSK)
}

// caFingerprintOf reads the root fingerprint recorded in an authority directory.
func caFingerprintOf(t *testing.T, dir string) string {
	t.Helper()
	var info struct {
		CAFingerprint string `json:"ca_fingerprint"`
	}
	data, err := os.ReadFile(filepath.Join(dir, "authority.json"))
	if err != nil || json.Unmarshal(data, &info) != nil || info.CAFingerprint == "" {
		t.Fatalf("reading %s/authority.json: %v", dir, err)
	}
	return info.CAFingerprint
}
