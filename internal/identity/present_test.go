package identity

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"net"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/spiffeid"
)

// agentIdentity issues an agent identity under h, its chain as saved.
func agentIdentity(t testing.TB, h *ca.Hierarchy) *Identity {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := spiffeid.New("td", spiffeid.RoleAgent, "n1")
	leaf, err := h.Issuer(ca.RoleAgent).Issue(ca.LeafRequest{PublicKey: key.Public(), SPIFFEID: id.URL(), CommonName: "n1",
		ClientAuth: true, NotBefore: time.Now().Add(-time.Minute), TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return &Identity{Chain: []*x509.Certificate{leaf, h.Issuer(ca.RoleAgent).Cert}, Key: key, Roots: []*x509.Certificate{h.Root}}
}

// authorityCert issues an authority's listener certificate under h, its
// chain as the authority serves it, and returns it with its SPIFFE ID.
func authorityCert(t testing.TB, h *ca.Hierarchy) (tls.Certificate, spiffeid.ID) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := spiffeid.New("td", spiffeid.RoleAuthority, "a")
	leaf, err := h.Issuer(ca.RoleServer).Issue(ca.LeafRequest{PublicKey: key.Public(), SPIFFEID: id.URL(),
		ServerAuth: true, NotBefore: time.Now().Add(-time.Minute), TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{leaf.Raw, h.Issuer(ca.RoleServer).Cert.Raw, h.Root.Raw}, PrivateKey: key, Leaf: leaf}, id
}

// presented runs one TLS handshake over a pipe and returns the
// certificates the client presented, as the server saw them.
func presented(server, client *tls.Config) ([]*x509.Certificate, error) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	type result struct {
		certs []*x509.Certificate
		err   error
	}
	done := make(chan result, 1)
	go func() {
		s := tls.Server(b, server)
		err := s.Handshake()
		done <- result{s.ConnectionState().PeerCertificates, err}
	}()
	cerr := tls.Client(a, client).Handshake()
	r := <-done
	if cerr != nil {
		return nil, cerr
	}
	return r.certs, r.err
}

// TestClientTLSPresentsTheLeafAloneWhenItsIssuerIsNamed: over a real
// handshake, a client presents its leaf alone exactly when the server names
// the leaf's issuer in its certificate request and the identity's chain
// holds that issuer; otherwise (a server that names nothing, or other
// names, or a chain whose second certificate is not the leaf's issuer) the
// whole chain, as before.
func TestClientTLSPresentsTheLeafAloneWhenItsIssuerIsNamed(t *testing.T) {
	h, err := ca.Create("present", time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	id := agentIdentity(t, h)
	// The leaf with another intermediate after it: never shortened.
	mismatched := &Identity{Chain: []*x509.Certificate{id.Chain[0], h.Issuer(ca.RoleAdmin).Cert}, Key: id.Key, Roots: id.Roots}
	leafOnly := &Identity{Chain: id.Chain[:1], Key: id.Key, Roots: id.Roots}
	srvCert, srvID := authorityCert(t, h)
	cases := []struct {
		name  string
		id    *Identity
		names []*x509.Certificate // the server's ClientCAs
		want  [][]byte
	}{
		{"server names the agent intermediate", id, []*x509.Certificate{h.Issuer(ca.RoleAgent).Cert, h.Issuer(ca.RoleAdmin).Cert}, [][]byte{id.Chain[0].Raw}},
		{"server names nothing", id, nil, [][]byte{id.Chain[0].Raw, id.Chain[1].Raw}},
		{"server names other intermediates", id, []*x509.Certificate{h.Issuer(ca.RoleAdmin).Cert, h.Root}, [][]byte{id.Chain[0].Raw, id.Chain[1].Raw}},
		{"chain's intermediate is not the leaf's issuer", mismatched, []*x509.Certificate{h.Issuer(ca.RoleAgent).Cert}, [][]byte{id.Chain[0].Raw, h.Issuer(ca.RoleAdmin).Cert.Raw}},
		{"identity holds its leaf only", leafOnly, []*x509.Certificate{h.Issuer(ca.RoleAgent).Cert}, [][]byte{id.Chain[0].Raw}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{srvCert}, ClientAuth: tls.RequestClientCert}
			if c.names != nil {
				srv.ClientCAs = pool(c.names)
			}
			certs, err := presented(srv, ClientTLS(c.id, h.RootPool(), MatchID(srvID)))
			if err != nil {
				t.Fatal(err)
			}
			var raw [][]byte
			for _, c := range certs {
				raw = append(raw, c.Raw)
			}
			if len(raw) != len(c.want) {
				t.Fatalf("presented %d certificates, want %d", len(raw), len(c.want))
			}
			for i := range raw {
				if !bytes.Equal(raw[i], c.want[i]) {
					t.Fatalf("certificate %d presented is not the one expected", i)
				}
			}
		})
	}
}

// FuzzPresented: whatever names a server sends, the client presents its own
// leaf, alone or followed by its own chain, and alone only when one of the
// names is the leaf's issuer.
func FuzzPresented(f *testing.F) {
	h, err := ca.Create("fuzz", time.Now().Add(-time.Hour))
	if err != nil {
		f.Fatal(err)
	}
	id := agentIdentity(f, h)
	f.Add(id.Chain[0].RawIssuer, []byte{})
	f.Add(h.Root.RawSubject, id.Chain[1].RawIssuer)
	f.Add([]byte{}, []byte{0x30, 0x00})
	present := id.presented()
	f.Fuzz(func(t *testing.T, a, b []byte) {
		cert, err := present(&tls.CertificateRequestInfo{AcceptableCAs: [][]byte{a, b}})
		if err != nil {
			t.Fatal(err)
		}
		named := bytes.Equal(a, id.Chain[0].RawIssuer) || bytes.Equal(b, id.Chain[0].RawIssuer)
		want := len(id.Chain)
		if named {
			want = 1
		}
		if len(cert.Certificate) != want || cert.PrivateKey != id.Key {
			t.Fatalf("presented %d certificates, want %d", len(cert.Certificate), want)
		}
		for i, der := range cert.Certificate {
			if !bytes.Equal(der, id.Chain[i].Raw) {
				t.Fatalf("certificate %d is not the identity's", i)
			}
		}
	})
}

// BenchmarkClientHandshake: one TLS 1.3 handshake, both ends in this
// process, an agent presenting its whole chain to a server that names
// nothing (before) and its leaf alone to one that names the agent and
// admin intermediates (now). B/op and allocs/op are the figures that do
// not move with the machine's load.
func BenchmarkClientHandshake(b *testing.B) {
	h, err := ca.Create("bench", time.Now().Add(-time.Hour))
	if err != nil {
		b.Fatal(err)
	}
	id := agentIdentity(b, h)
	srvCert, srvID := authorityCert(b, h)
	client := ClientTLS(id, h.RootPool(), MatchID(srvID))
	for _, c := range []struct {
		name  string
		names *x509.CertPool
		want  int
	}{
		{"whole-chain", nil, 2},
		{"leaf-alone", pool([]*x509.Certificate{h.Issuer(ca.RoleAgent).Cert, h.Issuer(ca.RoleAdmin).Cert}), 1},
	} {
		srv := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{srvCert}, ClientAuth: tls.RequestClientCert,
			ClientCAs: c.names}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				certs, err := presented(srv, client)
				if err != nil || len(certs) != c.want {
					b.Fatalf("handshake: %v, %d certificates presented, want %d", err, len(certs), c.want)
				}
			}
		})
	}
}
