package authority

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"github.com/muster-dev/muster/internal/errinfo"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/pgtest"
	"github.com/muster-dev/muster/internal/store/postgres"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestIntermediatesFromTheStore: the data directory's intermediates move
// into the store at the first start, sealed; a successor prepared and
// activated through the store signs every new leaf (agents' and the
// listener's) within moments, leaves of the one it replaced still renew
// while it is retiring, and not once it is retired.
func TestIntermediatesFromTheStore(t *testing.T) { testIntermediates(t, startBench(t)) }

// TestIntermediatesTwoReplicasPostgres: rotated through one replica, used
// by the other at once (its change notifications).
func TestIntermediatesTwoReplicasPostgres(t *testing.T) {
	t.Parallel()
	benchPGOnce.Do(func() { benchPG, benchPGErr = pgtest.Start() })
	if benchPGErr != nil {
		t.Fatalf("PostgreSQL: %v", benchPGErr)
	}
	url := benchPG.NewDatabase(t)
	testIntermediates(t, startReplicas(t, func(ctx context.Context) (store.Store, error) { return postgres.Open(ctx, url) }, 2))
}

func testIntermediates(t *testing.T, a *benchAuthority) {
	ctx := t.Context()
	rows, err := a.store.ListCACerts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 4 {
		t.Fatalf("the store holds %d CA certificates after the first start, want the 4 intermediates", len(rows))
	}
	for _, r := range rows {
		file := a.h.Issuers[ca.Role(r.Role)]
		if r.State != store.CAActive || !bytes.Equal(r.CertDER, file.Cert.Raw) || r.Serial != file.Cert.SerialNumber.Text(16) {
			t.Errorf("%s: %s %s, want the data directory's intermediate, active", r.Role, r.Serial, r.State)
		}
		der, _ := ca.EncodeKeyPEM(file.Key)
		raw, err := file.Key.(*ecdsa.PrivateKey).Bytes()
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(r.KeyRef, raw) || bytes.Contains(r.KeyRef, der) {
			t.Errorf("%s: the stored key reference holds the key in clear", r.Role)
		}
	}

	want, _ := spiffeid.New(a.info.TrustDomain, spiffeid.RoleAuthority, a.info.AuthorityID)
	dial := func(replica int, id *identity.Identity) *grpc.ClientConn {
		conn, err := grpc.NewClient(a.conns[replica].Target(), grpc.WithTransportCredentials(credentials.NewTLS(identity.ClientTLS(id, a.h.RootPool(), identity.MatchID(want)))))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	n := 0
	join := func(replica int) *identity.Identity {
		t.Helper()
		n++
		key, csr := benchCSR(t)
		resp, err := musterv1.NewBootstrapServiceClient(a.conns[replica]).ExchangeJoinToken(ctx, &musterv1.ExchangeJoinTokenRequest{
			JoinToken: a.token, NodeId: fmt.Sprintf("node-%d", n), Csr: csr})
		if err != nil {
			t.Fatalf("join through replica %d: %v", replica, err)
		}
		chain, _ := ca.ParseCertsPEM([]byte(resp.GetCertificateChainPem()))
		return &identity.Identity{Chain: chain, Key: key, Roots: []*x509.Certificate{a.h.Root}}
	}
	renew := func(replica int, id *identity.Identity) (*identity.Identity, error) {
		key, csr := benchCSR(t)
		r, err := musterv1.NewCertificateServiceClient(dial(replica, id)).RequestCertificate(ctx, &musterv1.RequestCertificateRequest{Csr: csr})
		if err != nil {
			return nil, err
		}
		chain, _ := ca.ParseCertsPEM([]byte(r.GetCertificateChainPem()))
		return &identity.Identity{Chain: chain, Key: key, Roots: []*x509.Certificate{a.h.Root}}, nil
	}
	listenerIssuer := func(replica int) []byte {
		c, err := tls.Dial("tcp", a.conns[replica].Target(), &tls.Config{RootCAs: a.h.RootPool(), ServerName: "127.0.0.1", NextProtos: []string{"h2"}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[1].Raw
	}
	last := len(a.srvs) - 1
	eventually := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("not within 10 s: %s", what)
			}
		}
	}

	// One leaf of the first intermediate for each replica to renew, and
	// one never renewed for after its retirement (a renewed leaf is
	// refused anyway, as superseded).
	var olds []*identity.Identity
	for range a.srvs {
		olds = append(olds, join(0))
	}
	old := join(0)
	if !bytes.Equal(old.Chain[1].Raw, a.h.Issuers[ca.RoleAgent].Cert.Raw) {
		t.Fatal("the first join is not signed by the imported agent intermediate")
	}
	next := map[ca.Role]store.CACert{}
	for _, role := range []ca.Role{ca.RoleAgent, ca.RoleServer} {
		row, err := a.srvs[0].inter.prepare(ctx, role, a.h.RootKey, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		next[role] = row
		if _, err := a.srvs[0].inter.prepare(ctx, role, a.h.RootKey, time.Hour); !errors.Is(err, store.ErrConflict) {
			t.Fatalf("a second prepared %s intermediate: %v, want a conflict", role, err)
		}
	}
	// Prepared: in the bundle, signing nothing yet.
	if got := join(last); !bytes.Equal(got.Chain[1].Raw, a.h.Issuers[ca.RoleAgent].Cert.Raw) {
		t.Fatal("a prepared intermediate signed a leaf")
	}
	for _, role := range []ca.Role{ca.RoleAgent, ca.RoleServer} {
		if err := a.store.ActivateCACert(ctx, string(role), next[role].Serial, setupLink); err != nil {
			t.Fatal(err)
		}
	}
	for r := range a.srvs {
		eventually(fmt.Sprintf("replica %d signs agents with the new intermediate", r), func() bool {
			return bytes.Equal(join(r).Chain[1].Raw, next[ca.RoleAgent].CertDER)
		})
		eventually(fmt.Sprintf("replica %d's listener chains to the new server intermediate", r), func() bool {
			return bytes.Equal(listenerIssuer(r), next[ca.RoleServer].CertDER)
		})
		// The old intermediate is retiring: its leaves renew, and the
		// renewed one comes from the new intermediate.
		renewed, err := renew(r, olds[r])
		if err != nil {
			t.Fatalf("replica %d: renewing a leaf of the retiring intermediate: %v", r, err)
		}
		if !bytes.Equal(renewed.Chain[1].Raw, next[ca.RoleAgent].CertDER) {
			t.Fatalf("replica %d renewed under the old intermediate", r)
		}
	}
	oldSerial := a.h.Issuers[ca.RoleAgent].Cert.SerialNumber.Text(16)
	for r, srv := range a.srvs {
		got := caNotAfter(t, srv)
		if got["agent/"+next[ca.RoleAgent].Serial] != next[ca.RoleAgent].NotAfter.Unix() || got["agent/"+oldSerial] == 0 {
			t.Fatalf("replica %d: muster_ca_not_after_seconds %v; want the new agent intermediate's and the retiring one's", r, got)
		}
	}
	if _, err := a.store.RetireCACert(ctx, string(ca.RoleAgent), oldSerial, setupLink); err != nil {
		t.Fatal(err)
	}
	for r := range a.srvs {
		eventually(fmt.Sprintf("replica %d refuses leaves of the retired intermediate", r), func() bool {
			_, err := renew(r, old)
			return status.Code(err) == codes.Unauthenticated && strings.Contains(err.Error(), "not issued by this authority") &&
				errinfo.Reason(err) == errinfo.ReasonIssuerUnknown
		})
		if got := caNotAfter(t, a.srvs[r]); got["agent/"+oldSerial] != 0 || len(got) != 5 {
			t.Fatalf("replica %d: muster_ca_not_after_seconds %v; want the retired one gone, 4 active and the retiring server one", r, got)
		}
	}
}

// caNotAfter reads muster_ca_not_after_seconds from srv's registry, as
// role/serial → seconds.
func caNotAfter(t *testing.T, srv *Server) map[string]int64 {
	t.Helper()
	mfs, err := srv.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, mf := range mfs {
		if mf.GetName() != "muster_ca_not_after_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			out[l["role"]+"/"+l["serial"]] = int64(m.GetGauge().GetValue())
		}
	}
	return out
}

// prepare is prepareUnder with the data directory's root, for tests.
func (in *intermediates) prepare(ctx context.Context, role ca.Role, rootKey crypto.Signer, ttl time.Duration) (store.CACert, error) {
	return in.prepareUnder(ctx, role, in.s.ca.Root, rootKey, ttl, in.s.testPrepareLink)
}

// testPrepareLink is the ca.prepare record of a test's prepare.
func (s *Server) testPrepareLink(row store.CACert) *audit.Link {
	return s.caStepLink("ca.prepare", row.Role, row.Serial, "test")
}
