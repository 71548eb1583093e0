package e2e

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/spiffeid"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// dialViaProxy connects as a TCP load balancer would: a PROXY protocol v1
// header naming the client, then the client's TLS.
func (e *joinEnv) dialViaProxy(t *testing.T, client string) musterv1.BootstrapServiceClient {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(e.root)
	want, _ := spiffeid.New(e.td, spiffeid.RoleAuthority, e.td)
	conn, err := grpc.NewClient(e.auth.addr,
		grpc.WithTransportCredentials(credentials.NewTLS(identity.ClientTLS(nil, pool, identity.MatchID(want)))),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			if err != nil {
				return nil, err
			}
			_, err = c.Write([]byte("PROXY TCP4 " + client + " 127.0.0.1 40000 7443\r\n"))
			return c, err
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return musterv1.NewBootstrapServiceClient(conn)
}

func TestTrustedProxyNamesTheSource(t *testing.T) {
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
	e := newJoinEnv(t)
	_, err := e.dialViaProxy(t, "198.51.100.7").ExchangeJoinToken(t.Context(), &musterv1.ExchangeJoinTokenRequest{
		JoinToken: "zzzzzz.0123456789abcdef", NodeId: "n1"})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("a PROXY header from an untrusted peer: %v, want the connection refused", err)
	}
}
