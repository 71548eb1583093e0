package authority

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// endingStream is an agent stream that brings one message and ends as it
// does: its first Recv cancels the stream's context (the certificate
// expiring, a newer stream replacing it, the authority stopping) and then
// returns the message; every later Recv returns io.EOF.
type endingStream struct {
	musterv1.AgentService_ConnectServer
	ctx  context.Context
	end  context.CancelFunc
	msg  *musterv1.AgentMessage
	read bool
}

func (s *endingStream) Context() context.Context { return s.ctx }

func (s *endingStream) Recv() (*musterv1.AgentMessage, error) {
	if s.read {
		return nil, io.EOF
	}
	s.read = true
	s.end()
	return s.msg, nil
}

// A task result that arrives as its stream ends is recorded all the same:
// it was recorded with the stream's context, and lost (the task pending
// until a later stream sent it again).
func TestTaskResultAsTheStreamEndsIsRecorded(t *testing.T) {
	b := startReplicas(t, nil, 1)
	s := b.srvs[0]
	const node = "n-ending"
	ctx := t.Context()
	now := time.Now()
	id := uuid.NewString()
	if err := b.store.InsertTask(ctx, store.Task{ID: id, Type: "rotate", SignerVersionID: "v1", Signed: []byte("signed"),
		CreatedBy: "test", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, []string{node}, setupLink); err != nil {
		t.Fatal(err)
	}
	sctx, end := context.WithCancel(ctx)
	defer end()
	stream := &endingStream{ctx: sctx, end: end, msg: &musterv1.AgentMessage{Body: &musterv1.AgentMessage_Result{
		Result: &musterv1.TaskResult{TaskId: id, State: store.TaskOK, SignerVersionId: "v1"}}}}
	st := &agentStream{a: &agentService{s: s}, stream: stream, ctx: sctx, recvErr: make(chan error, 1),
		c: Caller{ID: spiffeid.ID{TrustDomain: b.td, Role: spiffeid.RoleAgent, Name: node}}}
	go st.receive()
	if err := <-st.recvErr; err != io.EOF {
		t.Fatalf("the receive loop ended with %v, want io.EOF", err)
	}
	pending, err := b.store.PendingTasks(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	if len(pending) != 0 {
		t.Fatalf("the task is still pending: its result, sent as the stream ended, was not recorded")
	}
}
