package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestUnlimitedTokenAcrossReplicasPostgres: joins with one token of
// unlimited uses, spread over two replicas at once, all succeed; the
// operator's token get counts every one and dates the last (the
// PostgreSQL store counts these uses apart from the token's row); once
// the token is deleted, it admits nobody.
func TestUnlimitedTokenAcrossReplicasPostgres(t *testing.T) {
	t.Parallel()
	_, started := startReplicas(t, 2)
	var rs []*joinEnv
	for _, r := range started {
		e := &joinEnv{dir: r.dir, auth: r.auth}
		e.setup(t)
		rs = append(rs, e)
	}
	tok := rs[0].token(t, "--uses", "0")
	id := tok[:6]
	const n = 12
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, csr := newCSR(t)
			_, errs[i] = rs[i%2].boot.ExchangeJoinToken(context.Background(), &musterv1.ExchangeJoinTokenRequest{
				JoinToken: tok, NodeId: fmt.Sprintf("many-%d", i), Csr: csr})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("join %d: %v", i, err)
		}
	}
	info := rs[1].tokenInfo(t, id)
	if info["uses_count"] != float64(n) || info["last_used_at"] == nil || info["state"] != "active" {
		t.Errorf("token get after %d joins: %v", n, info)
	}
	mustRun(t, "token", "delete", id, "--data", rs[1].dir, "--authority", rs[1].auth.addr)
	_, csr := newCSR(t)
	_, err := rs[0].boot.ExchangeJoinToken(context.Background(), &musterv1.ExchangeJoinTokenRequest{
		JoinToken: tok, NodeId: "after-delete", Csr: csr})
	if status.Code(err) != codes.NotFound {
		t.Errorf("join after the token's deletion: %v, want NOT_FOUND", err)
	}
}
