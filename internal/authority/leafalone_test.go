package authority

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/spiffeid"
)

// leafAloneFixture is an authority's hierarchy, another one made with the
// same names (so its leaves name an issuer this authority advertises), and
// a Server holding just what serverTLS and clientChain use.
type leafAloneFixture struct {
	h, other *ca.Hierarchy
	srv      *Server
}

func newLeafAloneFixture(t *testing.T) *leafAloneFixture {
	t.Helper()
	start := time.Now().Add(-time.Hour)
	h, err := ca.Create("leaf", start)
	if err != nil {
		t.Fatal(err)
	}
	other, err := ca.Create("leaf", start)
	if err != nil {
		t.Fatal(err)
	}
	return &leafAloneFixture{h: h, other: other, srv: &Server{ca: h, certs: map[ca.Role]*tls.Certificate{},
		info: datadir.Info{TrustDomain: "leaf.test", AuthorityID: "auth-1"}}}
}

// identity issues an identity under h's role intermediate, valid from
// notBefore for an hour, with its chain (leaf, intermediate) as saved.
func (f *leafAloneFixture) identity(t *testing.T, h *ca.Hierarchy, role ca.Role, notBefore time.Time) *identity.Identity {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	r := spiffeid.RoleAgent
	if role == ca.RoleAdmin {
		r = spiffeid.RoleAdmin
	}
	id, _ := spiffeid.New("leaf.test", r, "n1")
	leaf, err := h.Issuer(role).Issue(ca.LeafRequest{PublicKey: key.Public(), SPIFFEID: id.URL(), CommonName: "n1",
		ClientAuth: true, NotBefore: notBefore, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return &identity.Identity{Chain: []*x509.Certificate{leaf, h.Issuer(role).Cert}, Key: key, Roots: []*x509.Certificate{h.Root}}
}

// handshake runs one TLS handshake between client and server over a pipe
// and returns what the server saw.
func handshake(t *testing.T, server, client *tls.Config) tls.ConnectionState {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	type result struct {
		cs  tls.ConnectionState
		err error
	}
	done := make(chan result, 1)
	go func() {
		c := tls.Server(b, server)
		err := c.Handshake()
		done <- result{c.ConnectionState(), err}
	}()
	cerr := tls.Client(a, client).Handshake()
	r := <-done
	if r.err != nil || cerr != nil {
		t.Fatalf("handshake: server %v, client %v", r.err, cerr)
	}
	return r.cs
}

// chainOf runs clientChain on what a TLS connection carried, as authorize
// does for a call on it.
func (s *Server) chainOf(cs tls.ConnectionState) ([]*x509.Certificate, error) {
	ctx := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: credentials.TLSInfo{State: cs}})
	return s.clientChain(ctx)
}

// TestClientsPresentTheirLeafAloneToTheAPIListener: the API listener names
// the agent and admin intermediates in its certificate request and
// verifies nothing in the handshake; a current client presents its leaf
// alone to it and its whole chain to a listener that names nothing; a
// client that presents its whole chain as older agents do is accepted as
// before. Each connection is then checked as a call on it would be: the
// chain the authority verifies ends in its own intermediate (requireRole's
// byte-for-byte check), and a foreign or expired leaf sent alone is refused
// with the reason it got presented whole.
func TestClientsPresentTheirLeafAloneToTheAPIListener(t *testing.T) {
	f := newLeafAloneFixture(t)
	api, err := f.srv.serverTLS(ca.RoleServer, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	if api.ClientAuth != tls.RequestClientCert {
		t.Fatalf("API listener ClientAuth %v, want RequestClientCert (certificates are checked per call)", api.ClientAuth)
	}
	boot, err := f.srv.serverTLS(ca.RoleBootstrap, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	if boot.ClientCAs != nil {
		t.Fatal("the bootstrap listener names client intermediates; it serves anonymous callers only")
	}
	now := time.Now()
	newClient := func(id *identity.Identity) *tls.Config {
		return identity.ClientTLS(id, f.h.RootPool(), func(spiffeid.ID) error { return nil })
	}
	// An agent before this change: its chain in Certificates, chosen by
	// crypto/tls.
	oldClient := func(id *identity.Identity) *tls.Config {
		c := newClient(nil)
		c.Certificates = []tls.Certificate{id.TLSCertificate()}
		return c
	}
	agent := f.identity(t, f.h, ca.RoleAgent, now)
	admin := f.identity(t, f.h, ca.RoleAdmin, now)
	expired := f.identity(t, f.h, ca.RoleAgent, now.Add(-3*time.Hour))
	foreign := f.identity(t, f.other, ca.RoleAgent, now)
	cases := []struct {
		name      string
		server    *tls.Config
		client    *tls.Config
		presented int
		issuer    ca.Role // the intermediate the verified chain ends in
		refused   string  // the reason clientChain gives
	}{
		{"agent to the API listener", api, newClient(agent), 1, ca.RoleAgent, ""},
		{"operator to the API listener", api, newClient(admin), 1, ca.RoleAdmin, ""},
		{"agent to a listener that names nothing", boot, newClient(agent), 2, ca.RoleAgent, ""},
		{"older agent, whole chain, to the API listener", api, oldClient(agent), 2, ca.RoleAgent, ""},
		{"older operator, whole chain, to the API listener", api, oldClient(admin), 2, ca.RoleAdmin, ""},
		{"expired agent, leaf alone", api, newClient(expired), 1, "", "expired"},
		{"expired agent, whole chain", boot, newClient(expired), 2, "", "expired"},
		{"foreign agent, same issuer name, leaf alone", api, newClient(foreign), 1, "", "not issued by this authority"},
		{"foreign agent, same issuer name, whole chain", boot, newClient(foreign), 2, "", "not issued by this authority"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cs := handshake(t, c.server, c.client)
			if len(cs.PeerCertificates) != c.presented {
				t.Fatalf("the client presented %d certificates, want %d", len(cs.PeerCertificates), c.presented)
			}
			if len(cs.VerifiedChains) != 0 {
				t.Fatal("the handshake verified the client certificate; that is authorize's, per call")
			}
			// Both ways of checking: the short path, and the full check
			// alone (an authority whose root has constraints has no short
			// path).
			full := &Server{ca: f.h}
			noShortPath := buildAnchors(f.h, f.h.CurrentIntermediates())
			noShortPath.anchors = nil
			full.anchors.st.Store(noShortPath)
			for _, s := range []*Server{f.srv, full} {
				chain, err := s.chainOf(cs)
				if c.refused != "" {
					if err == nil || !strings.Contains(err.Error(), c.refused) {
						t.Fatalf("clientChain: %v, want a refusal saying %q", err, c.refused)
					}
					continue
				}
				if err != nil {
					t.Fatalf("clientChain: %v", err)
				}
				if len(chain) < 2 || !bytes.Equal(chain[1].Raw, f.h.Issuer(c.issuer).Cert.Raw) {
					t.Fatalf("the verified chain does not end in the %s intermediate", c.issuer)
				}
			}
		})
	}
}
