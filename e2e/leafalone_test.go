package e2e

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"path/filepath"
	"slices"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/spiffeid"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestAuthorityNamesItsClientIntermediates: the running authority's API
// listener names its agent and admin intermediates in its certificate
// request, so a current agent presents its leaf alone (identity.ClientTLS),
// and an agent that presents its whole chain, as agents before this did,
// still renews.
func TestAuthorityNamesItsClientIntermediates(t *testing.T) {
	t.Parallel()
	e := newJoinEnv(t)
	h, err := ca.Load(filepath.Join(e.dir, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	var named [][]byte
	tc := identity.ClientTLS(nil, h.RootPool(), func(spiffeid.ID) error { return nil })
	tc.GetClientCertificate = func(cri *tls.CertificateRequestInfo) (*tls.Certificate, error) {
		named = cri.AcceptableCAs
		return &tls.Certificate{}, nil
	}
	conn, err := tls.Dial("tcp", e.auth.addr, tc)
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	for _, role := range []ca.Role{ca.RoleAgent, ca.RoleAdmin} {
		if !slices.ContainsFunc(named, func(n []byte) bool { return bytes.Equal(n, h.Issuer(role).Cert.RawSubject) }) {
			t.Errorf("the certificate request does not name the %s intermediate", role)
		}
	}
	if len(named) != 2 {
		t.Errorf("the certificate request names %d authorities, want the agent and admin intermediates", len(named))
	}

	// An older agent: its whole chain in Certificates, as crypto/tls
	// chooses it (the names match its leaf's issuer, so it is sent).
	id, _ := e.join(t, e.token(t), "n1")
	pool := x509.NewCertPool()
	pool.AddCert(e.root)
	want, _ := spiffeid.New(e.td, spiffeid.RoleAuthority, e.td)
	old := identity.ClientTLS(nil, pool, identity.MatchID(want))
	old.Certificates = []tls.Certificate{id.TLSCertificate()}
	cc, err := grpc.NewClient(e.auth.addr, grpc.WithTransportCredentials(credentials.NewTLS(old)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	_, csr := newCSR(t)
	r, err := musterv1.NewCertificateServiceClient(cc).RequestCertificate(t.Context(), &musterv1.RequestCertificateRequest{Csr: csr})
	if err != nil || r.GetGeneration() != 1 {
		t.Fatalf("renewal presenting the whole chain: %v, generation %d", err, r.GetGeneration())
	}
}
