package discoveryd

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"testing"

	proxyproto "github.com/pires/go-proxyproto"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/discovery"
	"github.com/muster-dev/muster/internal/discoveryclient"
	"github.com/muster-dev/muster/internal/listener"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// trusting makes the server honour PROXY headers from proxies.
func trusting(t *testing.T, proxies ...string) option {
	t.Helper()
	trusted, err := listener.ParseTrustedProxies(proxies)
	if err != nil {
		t.Fatal(err)
	}
	return func(s *Server) { s.cfg.TrustedProxies = trusted }
}

// viaProxy is a client whose connections reach discovery as a TCP load
// balancer forwards them: a PROXY protocol v2 header naming client
// (IP:PORT), then the client's own TLS, pinned as usual.
func (e *env) viaProxy(client string) musterv1.DiscoveryServiceClient {
	t := e.t
	t.Helper()
	tc, err := discoveryclient.TLSConfig(e.srv.Fingerprint())
	if err != nil {
		t.Fatal(err)
	}
	src := net.TCPAddrFromAddrPort(netip.MustParseAddrPort(client))
	conn, err := grpc.NewClient(e.addr,
		grpc.WithTransportCredentials(credentials.NewTLS(tc)),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			if err != nil {
				return nil, err
			}
			if _, err := proxyproto.HeaderProxyFromAddrs(2, src, c.RemoteAddr()).WriteTo(c); err != nil {
				c.Close()
				return nil, err
			}
			return c, nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return musterv1.NewDiscoveryServiceClient(conn)
}

// deniedSources are the sources of the audited ticket refusals, once the
// server has stopped and flushed them.
func (e *env) deniedSources() []string {
	e.t.Helper()
	e.stop()
	recs, err := e.st.ListAudit(context.Background(), store.AuditFilter{})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, r := range recs {
		if r.Action == "referral_ticket.issue" && r.Result == "denied" {
			out = append(out, r.Source)
		}
	}
	slices.Sort(out)
	return out
}

// TestTrustedProxyNamesTheSource: behind a trusted balancer, the policy's
// allowed CIDRs and per-source limit, the ticket's source_ip and the audit
// log all see the client the PROXY header names, not the balancer.
func TestTrustedProxyNamesTheSource(t *testing.T) {
	e := start(t, generous, trusting(t, "127.0.0.0/8"))
	a := newAuthority(t, "prod")
	p := openPolicy()
	p.AllowedCIDRs = []string{"198.51.100.0/24"}
	p.RateLimits.PerSource = discovery.Rate{PerMinute: 1, Burst: 1}
	// A trusted peer without a header (the balancer's own health check,
	// or here the test's direct client) is served as it is.
	e.register(a, 1, p)
	ask := func(c musterv1.DiscoveryServiceClient, node string) (*musterv1.RequestReferralTicketResponse, error) {
		return c.RequestReferralTicket(ctxT(t), &musterv1.RequestReferralTicketRequest{AuthorityId: a.id, NodeId: node})
	}

	resp, err := ask(e.viaProxy("198.51.100.7:40000"), "web-1")
	if err != nil {
		t.Fatalf("ticket for a client in the allowed CIDRs, through the proxy: %v", err)
	}
	claims, err := e.verifier(a).Verify(ctxT(t), resp.GetTicket(), "web-1")
	if err != nil {
		t.Fatal(err)
	}
	if claims.SourceIP != "198.51.100.7" {
		t.Errorf("ticket source_ip %q, want the client's 198.51.100.7", claims.SourceIP)
	}
	// The per-source bucket is the client's: spent for .7, whole for .8.
	_, err = ask(e.viaProxy("198.51.100.7:40001"), "web-2")
	wantCode(t, err, codes.ResourceExhausted, "per source")
	if _, err := ask(e.viaProxy("198.51.100.8:40000"), "web-3"); err != nil {
		t.Errorf("ticket for another client through the same proxy: %v", err)
	}
	// Outside the allowed CIDRs, through the proxy or straight from it.
	_, err = ask(e.viaProxy("203.0.113.9:40000"), "web-4")
	wantCode(t, err, codes.PermissionDenied, discovery.DenySource)
	_, err = ask(e.client, "web-5")
	wantCode(t, err, codes.PermissionDenied, discovery.DenySource)

	if got, want := e.deniedSources(), []string{"127.0.0.1", "198.51.100.7", "203.0.113.9"}; !slices.Equal(got, want) {
		t.Errorf("refusals audited from %v, want %v", got, want)
	}
}

// TestUntrustedProxyHeaderIsNotHonoured: a PROXY header from a peer that
// is not a trusted proxy is never read as one. It reaches TLS as it is and
// the connection fails; nobody can name another source.
func TestUntrustedProxyHeaderIsNotHonoured(t *testing.T) {
	for name, opts := range map[string][]option{
		"no trusted proxies":    {generous},
		"another trusted range": {generous, trusting(t, "192.0.2.0/24")},
	} {
		t.Run(name, func(t *testing.T) {
			e := start(t, opts...)
			a := newAuthority(t, "prod")
			e.register(a, 1, openPolicy())
			req := &musterv1.RequestReferralTicketRequest{AuthorityId: a.id, NodeId: "web-1"}
			_, err := e.viaProxy("198.51.100.7:40000").RequestReferralTicket(ctxT(t), req)
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("a PROXY header from an untrusted peer: %v, want the connection refused", err)
			}
			resp, err := e.client.RequestReferralTicket(ctxT(t), req)
			if err != nil {
				t.Fatalf("direct client: %v", err)
			}
			claims, err := e.verifier(a).Verify(ctxT(t), resp.GetTicket(), "web-1")
			if err != nil || claims.SourceIP != "127.0.0.1" {
				t.Errorf("direct ticket: source_ip %q, %v; want the TCP peer 127.0.0.1", claims.SourceIP, err)
			}
		})
	}
}
