package e2e

import (
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestReplicasShareSignersAndStreams: on two replicas of one PostgreSQL
// store, a signer staged through one replica is rolled out to an agent
// whose stream the other holds, a signer activated through one is the one
// the other signs with, a task sent through one reaches the agent on the
// other within a second, and a lock made through one closes the stream on
// the other within a second.
func TestReplicasShareSignersAndStreams(t *testing.T) {
	_, rs := startReplicas(t, 2)
	a, b := rs[0], rs[1]
	on := func(r *agentEnv, args ...string) string {
		return mustRun(t, append(args, "--data", r.dir, "--authority", r.auth.addr)...)
	}
	var tok createdToken
	if err := json.Unmarshal([]byte(on(a, "token", "create", "-o", "json")), &tok); err != nil {
		t.Fatal(err)
	}
	adir := filepath.Join(t.TempDir(), "agent")
	if r := muster(t, nil, "agent", "join", "--data", adir, "--node", "n1", tok.URI); r.code != 0 {
		t.Fatalf("join: %s", r.stderr)
	}
	ag, _ := startProc(t, "agent", "stream to the authority open", "agent", "run", "--data", adir, "--log-format", "json")
	waitFor(t, 5*time.Second, "replica a holds the stream", func() bool { return strings.Contains(a.auth.Logs(), "agent stream opened") })

	on(b, "signer", "stage", "--effective-in", "15m")
	waitFor(t, agentReach, "the rotate task sent through b reaches the agent on a", func() bool {
		st := agentStatus(t, adir)
		return st["last_rotate_task"] != nil && acceptedByNumber(st)["v2"] == "staged"
	})

	on(b, "signer", "activate")
	var sent struct {
		SignerVersionID string `json:"signer_version_id"`
	}
	if err := json.Unmarshal([]byte(on(a, "task", "send", "--type", "node.report", "--node", "n1", "-o", "json")), &sent); err != nil || !strings.HasPrefix(sent.SignerVersionID, "v2-") {
		t.Fatalf("replica a signs with %q after b activated v2 (%v)", sent.SignerVersionID, err)
	}

	// A task queued through b wakes the stream on a by notification, not
	// by a poll of the store.
	var task struct {
		TaskID string `json:"task_id"`
	}
	if err := json.Unmarshal([]byte(on(b, "task", "send", "--type", "node.report", "--node", "n1", "-o", "json")), &task); err != nil || task.TaskID == "" {
		t.Fatalf("task send through b: %v", err)
	}
	took := waitFor(t, time.Second, "the task sent through b reaches the agent on a", func() bool {
		return strings.Contains(grepLines(ag.Logs(), `"msg":"task done"`), task.TaskID)
	})
	t.Logf("task sent through replica b done by the agent on replica a %s after the send returned", took)

	on(b, "lock", "create", "--node", "n1", "--reason", "test")
	took = waitFor(t, 1500*time.Millisecond, "the stream on a closes after the lock through b", func() bool {
		l := grepLines(a.auth.Logs(), `"msg":"agent stream closed"`)
		return strings.Contains(l, "locked")
	})
	t.Logf("stream on replica a closed %s after the lock through replica b", took)
	waitingOutLock(t, ag)
}

// TestOneStreamPerAgentAcrossReplicas: an agent identity that opens a
// stream on replica a, then one on replica b, keeps only the newer: a ends
// its stream ABORTED within seconds, told by the store's change
// notification, and audits the replacement; the node is shown connected
// through b. Before, both streams stayed open, and each heartbeat of the
// older one took the node's stream row back.
func TestOneStreamPerAgentAcrossReplicas(t *testing.T) {
	_, rs := startReplicas(t, 2)
	a, b := rs[0], rs[1]
	var tok createdToken
	if err := json.Unmarshal([]byte(mustRun(t, "token", "create", "-o", "json", "--data", a.dir, "--authority", a.auth.addr)), &tok); err != nil {
		t.Fatal(err)
	}
	adir := filepath.Join(t.TempDir(), "agent")
	if r := muster(t, nil, "agent", "join", "--data", adir, "--node", "n1", tok.URI); r.code != 0 {
		t.Fatalf("join: %s", r.stderr)
	}
	open := func(r *agentEnv) (musterv1.AgentService_ConnectClient, chan error) {
		stream, err := musterv1.NewAgentServiceClient(agentDial(t, r.auth.addr, adir)).Connect(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); err != nil { // the verifier set: open
			t.Fatal(err)
		}
		ended := make(chan error, 1)
		go func() {
			for {
				if _, err := stream.Recv(); err != nil {
					ended <- err
					return
				}
			}
		}()
		return stream, ended
	}
	heartbeat := func(s musterv1.AgentService_ConnectClient) {
		_ = s.Send(&musterv1.AgentMessage{Body: &musterv1.AgentMessage_Heartbeat{Heartbeat: &musterv1.Heartbeat{}}})
	}
	sa, endedA := open(a)
	heartbeat(sa)
	sb, endedB := open(b)
	start := time.Now()
	select {
	case err := <-endedA:
		if status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "replaced by a newer stream") {
			t.Fatalf("the older stream, on replica a, ended with %v", err)
		}
		t.Logf("the stream on replica a ended %s after replica b opened a newer one", time.Since(start).Round(time.Millisecond))
	case <-time.After(5 * time.Second):
		t.Fatal("two replicas each hold a stream of the same agent")
	}
	heartbeat(sb)
	select {
	case err := <-endedB:
		t.Fatalf("the newer stream, on replica b, ended: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	recs := auditOf(t, a.dir, "agent.stream_replace")
	if len(recs) != 1 || recs[0].Target != "n1" || !strings.Contains(recs[0].Reason, "on replica "+b.auth.addr) {
		t.Fatalf("the replacement across replicas audited once, naming replica b: %+v", recs)
	}
	waitFor(t, 5*time.Second, "the node shown connected through replica b", func() bool {
		out := mustRun(t, "agents", "show", "n1", "--data", a.dir, "--authority", a.auth.addr)
		return strings.Contains(out, "Stream: connected") && strings.Contains(out, b.auth.addr)
	})
}

// TestStreamCopiesAcrossReplicasSuspectedOnce: two holders of one agent
// identity (a cloned data directory: the same certificate, from two
// hosts, 127.0.0.1 and 127.0.0.2) each reconnecting to its own replica
// take the stream from each other through the store's row; after three
// alternations, each within 5 minutes, the copy is audited
// agent.stream_copy_suspected once, by one of the two replicas, naming
// both hosts. Before, neither replica saw the other's holder, and none
// was audited.
func TestStreamCopiesAcrossReplicasSuspectedOnce(t *testing.T) {
	t.Parallel()
	_, rs := startReplicas(t, 2)
	a, b := rs[0], rs[1]
	var tok createdToken
	if err := json.Unmarshal([]byte(mustRun(t, "token", "create", "-o", "json", "--data", a.dir, "--authority", a.auth.addr)), &tok); err != nil {
		t.Fatal(err)
	}
	adir := filepath.Join(t.TempDir(), "agent")
	if r := muster(t, nil, "agent", "join", "--data", adir, "--node", "n1", tok.URI); r.code != 0 {
		t.Fatalf("join: %s", r.stderr)
	}
	open := func(r *agentEnv, from string) chan error {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		dial := grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) })
		stream, err := musterv1.NewAgentServiceClient(agentDial(t, r.auth.addr, adir, dial)).Connect(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); err != nil { // the verifier set: open
			t.Fatal(err)
		}
		ended := make(chan error, 1)
		go func() {
			for {
				if _, err := stream.Recv(); err != nil {
					ended <- err
					return
				}
			}
		}()
		return ended
	}
	// The first copy on a, the second on b, in turns: each open replaces
	// the other's stream, which ends ABORTED before the next turn.
	var ended chan error
	for i := range 5 {
		r, from := a, "127.0.0.1"
		if i%2 == 1 {
			r, from = b, "127.0.0.2"
		}
		next := open(r, from)
		if ended != nil {
			select {
			case err := <-ended:
				if status.Code(err) != codes.Aborted {
					t.Fatalf("turn %d: the replaced stream ended with %v, want ABORTED", i, err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("turn %d: the other copy's stream was not replaced", i)
			}
		}
		ended = next
	}
	recs := auditOf(t, a.dir, "agent.stream_copy_suspected")
	if len(recs) != 1 || recs[0].Target != "n1" || !strings.Contains(recs[0].Reason, "127.0.0.1 (certificate") || !strings.Contains(recs[0].Reason, "127.0.0.2 (certificate") {
		t.Fatalf("the copy across replicas audited once, naming both hosts: %+v", recs)
	}
}
