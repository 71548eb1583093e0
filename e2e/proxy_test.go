package e2e

import (
	"encoding/json"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// dialViaProxy connects as a TCP load balancer would: a PROXY protocol v1
// header naming the client, then the client's TLS.
func (e *joinEnv) dialViaProxy(t *testing.T, client string) musterv1.BootstrapServiceClient {
	t.Helper()
	return musterv1.NewBootstrapServiceClient(e.dialFrom(t, client, nil))
}

func TestTrustedProxyNamesTheSource(t *testing.T) {
	t.Parallel()
	e := newJoinEnv(t, "--trusted-proxy", "127.0.0.1")
	_, err := e.dialViaProxy(t, "198.51.100.7").ExchangeJoinToken(t.Context(), &musterv1.ExchangeJoinTokenRequest{
		JoinToken: "zzzzzz.0123456789abcdef", NodeId: "n1"})
	wantCode(t, err, codes.NotFound, "")
	var recs []map[string]any
	json.Unmarshal([]byte(mustRun(t, "audit", "list", "--data", e.dir, "--action", "agent.join", "-o", "json")), &recs)
	if len(recs) != 1 || recs[0]["source"] != "198.51.100.7" {
		t.Fatalf("refusal audited with %v, want source 198.51.100.7", recs)
	}
	// Direct clients still work beside the balancer.
	e.join(t, e.token(t), "direct")
}

func TestUntrustedProxyHeaderIsRefused(t *testing.T) {
	t.Parallel()
	e := newJoinEnv(t)
	_, err := e.dialViaProxy(t, "198.51.100.7").ExchangeJoinToken(t.Context(), &musterv1.ExchangeJoinTokenRequest{
		JoinToken: "zzzzzz.0123456789abcdef", NodeId: "n1"})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("a PROXY header from an untrusted peer: %v, want the connection refused", err)
	}
}
