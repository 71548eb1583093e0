package enroll

import (
	"context"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/jointoken"
	"github.com/muster-dev/muster/internal/store"
)

// guessStore records what each join's write was told of its node.
type guessStore struct {
	Store
	free *[]bool
}

func (g guessStore) CommitJoin(ctx context.Context, j store.Join) (store.JoinResult, error) {
	*g.free = append(*g.free, j.NodeFreeAtRead)
	return g.Store.CommitJoin(ctx, j)
}

// TestJoinWriteIsToldTheNodeWasFree: a token join whose read found its
// node ID free tells the write so (store.Join.NodeFreeAtRead), which then
// need not read the node again; one whose read found the node held (a
// re-provisioning with a token bound to it) does not. Before, no join
// told the write, and each read the node twice.
func TestJoinWriteIsToldTheNodeWasFree(t *testing.T) {
	var free []bool
	e := newEnv(t, func(s Store) Store { return guessStore{Store: s, free: &free} })
	tok := e.token(t, 1)
	_, der := csr(t)
	if _, err := e.svc.ExchangeJoinToken(t.Context(), Request{}, tok.Reveal(), "n1", der); err != nil {
		t.Fatal(err)
	}
	bound := boundToken(t, e, "n1")
	_, der2 := csr(t)
	if _, err := e.svc.ExchangeJoinToken(t.Context(), Request{}, bound.Reveal(), "n1", der2); err != nil {
		t.Fatal(err)
	}
	if len(free) != 2 || !free[0] || free[1] {
		t.Fatalf("the writes were told the node was free: %v, want [true false] (a new node, then a held one)", free)
	}
}

// boundToken inserts a single-use join token bound to nodeID.
func boundToken(t *testing.T, e *env, nodeID string) jointoken.Token {
	t.Helper()
	tok, _ := jointoken.Generate()
	ct, nonce, _ := e.seal.Seal(tok.Secret(), []byte(tok.ID))
	if err := e.st.InsertToken(t.Context(), store.Token{ID: tok.ID, JoinMethod: store.JoinMethodToken, Ciphertext: ct, Nonce: nonce,
		UsesAllowed: 1, NodeID: nodeID, CreatedAt: time.Now()}, setupLink); err != nil {
		t.Fatal(err)
	}
	return tok
}
