package authority

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/sqlite"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// perNodeReads counts the reads a listing would make once per node.
type perNodeReads struct {
	store.Store
	reads, pages atomic.Int64
}

func (c *perNodeReads) GetNode(ctx context.Context, id string) (store.Node, error) {
	c.reads.Add(1)
	return c.Store.GetNode(ctx, id)
}
func (c *perNodeReads) GetInstance(ctx context.Context, id string) (store.Instance, error) {
	c.reads.Add(1)
	return c.Store.GetInstance(ctx, id)
}
func (c *perNodeReads) FindAnyLock(ctx context.Context, ts []store.LockTarget) (store.Lock, error) {
	c.reads.Add(1)
	return c.Store.FindAnyLock(ctx, ts)
}
func (c *perNodeReads) GetAgentStream(ctx context.Context, id string) (store.AgentStream, error) {
	c.reads.Add(1)
	return c.Store.GetAgentStream(ctx, id)
}
func (c *perNodeReads) GetToken(ctx context.Context, id string) (store.Token, error) {
	c.reads.Add(1)
	return c.Store.GetToken(ctx, id)
}
func (c *perNodeReads) ListAgentsPage(ctx context.Context, after string, limit int) ([]store.AgentRow, error) {
	c.pages.Add(1)
	return c.Store.ListAgentsPage(ctx, after, limit)
}

// TestListAgentsReadsOncePerPage: a page of agents is one store query,
// not about four reads a node (instance, locks, stream, token), and it
// says what the node-by-node reads said: lock, stream and expiry.
func TestListAgentsReadsOncePerPage(t *testing.T) {
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := t.Context()
	now := time.Now().UTC().Truncate(time.Microsecond)
	const nodes = 120
	for i := range nodes {
		id, inst := fmt.Sprintf("node-%03d", i), fmt.Sprintf("inst-%03d", i)
		serial := fmt.Sprintf("%06x", i+1)
		if _, err := st.CommitJoin(ctx, store.Join{NodeID: id,
			Instance: store.Instance{ID: inst, JoinMethod: store.JoinMethodPSK, CreatedAt: now, LastSerial: serial,
				LastPublicKey: []byte{byte(i)}, LastChainPEM: []byte("chain"), LastIssuedAt: now},
			Certificate: store.Certificate{Serial: serial, NodeID: id, InstanceID: inst, JoinMethod: store.JoinMethodPSK,
				PublicKey: []byte{byte(i)}, NotBefore: now, NotAfter: now.Add(time.Hour), IssuedAt: now}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.InsertLock(ctx, store.Lock{ID: "l1", Kind: store.LockNode, Target: "node-007", Reason: "r", CreatedBy: "admin", CreatedAt: now}, setupLink); err != nil {
		t.Fatal(err)
	}
	if err := st.RecordAgentStream(ctx, store.AgentStream{NodeID: "node-009", Replica: "r:1", Connected: true, ConnectedAt: now, LastSeen: now}); err != nil {
		t.Fatal(err)
	}
	c := &perNodeReads{Store: st}
	a := &adminService{s: &Server{store: c, log: slog.New(slog.NewTextHandler(io.Discard, nil))}}
	resp, err := a.listAgents(ctx, &musterv1.ListAgentsRequest{PageSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetAgents()) != 100 || resp.GetNextPageToken() == "" {
		t.Fatalf("a page of 100: %d agents, next %q", len(resp.GetAgents()), resp.GetNextPageToken())
	}
	if r, p := c.reads.Load(), c.pages.Load(); r != 0 || p != 1 {
		t.Errorf("a page of 100 agents: %d per-node reads and %d page queries; want 0 and 1", r, p)
	}
	got := resp.GetAgents()
	if got[7].GetLocked() != "l1 (node node-007)" || got[9].GetStream().GetReplica() != "r:1" || got[8].GetStream() != nil ||
		!got[0].GetNotAfter().AsTime().Equal(now.Add(time.Hour)) {
		t.Errorf("agents: lock %q, stream %v / %v, expiry %v", got[7].GetLocked(), got[9].GetStream(), got[8].GetStream(), got[0].GetNotAfter())
	}
}
