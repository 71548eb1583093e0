package authority

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net/url"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/errinfo"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// deniedAudit returns the reason of the newest api.access denial of
// method, failing the test if there is none.
func deniedAudit(t *testing.T, a *benchAuthority, method string) string {
	t.Helper()
	recs, err := a.store.ListAudit(t.Context(), store.AuditFilter{Action: "api.access"})
	if err != nil {
		t.Fatal(err)
	}
	for i := len(recs) - 1; i >= 0; i-- {
		if r := recs[i]; r.Target == method && r.Result == audit.ResultDenied {
			return r.Reason
		}
	}
	t.Fatalf("no api.access denial audited for %s", method)
	return ""
}

// TestAuthorizationRefusalsNameTheWayOut: a call refused for its identity
// (none, an agent's on an admin RPC, a locked operator) tells the caller,
// and the audit record, what identity the call needs; a locked operator's
// record names the lock and the command that lifts it, while the caller
// keeps DESIGN.md's word, locked.
func TestAuthorizationRefusalsNameTheWayOut(t *testing.T) {
	t.Parallel()
	a := startBench(t)
	ctx := t.Context()
	const getStatus = "/muster.v1.AdminService/GetStatus"

	// No client certificate.
	_, err := musterv1.NewAdminServiceClient(a.conn).GetStatus(ctx, &musterv1.GetStatusRequest{})
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(status.Convert(err).Message(), "muster admin add") {
		t.Errorf("admin call without a certificate: %v, want UNAUTHENTICATED naming muster admin add", err)
	}
	if r := deniedAudit(t, a, getStatus); !strings.Contains(r, "muster admin add") {
		t.Errorf("audited reason %q does not name muster admin add", r)
	}

	// An agent's certificate on an admin RPC.
	agentConn := a.dial(a.joinedIdentity(t, "way-out-1"))
	_, err = musterv1.NewAdminServiceClient(agentConn).GetStatus(ctx, &musterv1.GetStatusRequest{})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), "operator identity") {
		t.Errorf("admin call with an agent certificate: %v, want PERMISSION_DENIED naming the operator identity it needs", err)
	}
	if r := deniedAudit(t, a, getStatus); !strings.Contains(r, "muster admin add") {
		t.Errorf("audited reason %q does not name muster admin add", r)
	}

	// A locked operator.
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	op, _ := spiffeid.New(a.info.TrustDomain, spiffeid.RoleAdmin, "mallory")
	opLeaf, err := a.h.Issuer(ca.RoleAdmin).Issue(ca.LeafRequest{PublicKey: k.Public(), SPIFFEID: op.URL(), CommonName: "mallory",
		ClientAuth: true, NotBefore: time.Now(), TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.store.InsertLock(ctx, store.Lock{ID: "lock-mallory", Kind: store.LockAdmin, Target: "mallory", Reason: "laptop stolen",
		CreatedBy: "admin", CreatedAt: time.Now()}, setupLink); err != nil {
		t.Fatal(err)
	}
	opConn := a.dial(&identity.Identity{Chain: []*x509.Certificate{opLeaf, a.h.Issuer(ca.RoleAdmin).Cert}, Key: k,
		Roots: []*x509.Certificate{a.h.Root}})
	_, err = musterv1.NewAdminServiceClient(opConn).GetStatus(ctx, &musterv1.GetStatusRequest{})
	if status.Code(err) != codes.PermissionDenied || status.Convert(err).Message() != "locked" || errinfo.Reason(err) != "locked" {
		t.Errorf("locked operator: %v (reason %q), want PERMISSION_DENIED: locked", err, errinfo.Reason(err))
	}
	if r := deniedAudit(t, a, getStatus); !strings.Contains(r, "lock-mallory") || !strings.Contains(r, "muster lock delete lock-mallory") {
		t.Errorf("audited reason %q does not name the lock and muster lock delete", r)
	}
}

// TestAgentBadRequestsAudited: an agent's malformed JWT-SVID or
// verifier-set request is refused with INVALID_ARGUMENT and audited,
// naming the method and what was wrong.
func TestAgentBadRequestsAudited(t *testing.T) {
	t.Parallel()
	a := startBench(t)
	ctx := t.Context()
	agent := musterv1.NewAgentServiceClient(a.dial(a.joinedIdentity(t, "bad-req-1")))
	_, err := agent.MintJWTSVID(ctx, &musterv1.MintJWTSVIDRequest{})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("JWT-SVID without an audience: %v, want INVALID_ARGUMENT", err)
	}
	if r := deniedAudit(t, a, "/muster.v1.AgentService/MintJWTSVID"); !strings.Contains(r, "audience") {
		t.Errorf("audited reason %q does not say the audience is wrong", r)
	}
	_, err = agent.GetVerifierSet(ctx, &musterv1.GetVerifierSetRequest{HaveVersion: -1})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("verifier set with have_version -1: %v, want INVALID_ARGUMENT", err)
	}
	if r := deniedAudit(t, a, "/muster.v1.AgentService/GetVerifierSet"); !strings.Contains(r, "have_version") {
		t.Errorf("audited reason %q does not name have_version", r)
	}
}

// TestForeignCertificateRefusalNamesTheWayOut: a client certificate from
// another CA is refused UNAUTHENTICATED naming how an agent or an operator
// gets one this authority accepts, in the answer and the audit record.
func TestForeignCertificateRefusalNamesTheWayOut(t *testing.T) {
	t.Parallel()
	a := startBench(t)
	ctx := t.Context()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "stranger"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, k.Public(), k)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	conn := a.dial(&identity.Identity{Chain: []*x509.Certificate{leaf}, Key: k, Roots: []*x509.Certificate{a.h.Root}})
	_, err = musterv1.NewAdminServiceClient(conn).GetStatus(ctx, &musterv1.GetStatusRequest{})
	if msg := status.Convert(err).Message(); status.Code(err) != codes.Unauthenticated ||
		!strings.Contains(msg, "not issued by this authority") || !strings.Contains(msg, "muster agent join") || !strings.Contains(msg, "muster admin add") {
		t.Errorf("a foreign certificate: %v, want UNAUTHENTICATED naming muster agent join and muster admin add", err)
	}
	if r := deniedAudit(t, a, "/muster.v1.AdminService/GetStatus"); !strings.Contains(r, "muster admin add") {
		t.Errorf("audited reason %q does not name the way out", r)
	}
}

// TestUnheldIntermediateRefusalNamesTheJoin: an agent certificate of this
// trust domain issued by an agent intermediate the authority does not
// hold (a store restored from a backup taken before that intermediate was
// prepared: every agent renewed under it since) is refused naming the
// join that brings the agent back, with its node, in the answer and the
// audit record; before, it was told only "muster agent join", as a
// certificate of another authority is.
func TestUnheldIntermediateRefusalNamesTheJoin(t *testing.T) {
	t.Parallel()
	a := startBench(t)
	held := a.h.Accepted(ca.RoleAgent)[0]
	ik, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	// The successor the restored store lost: the held one's name, another key.
	itmpl := &x509.Certificate{SerialNumber: big.NewInt(8), Subject: held.Subject,
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	ider, err := x509.CreateCertificate(rand.Reader, itmpl, itmpl, ik.Public(), ik)
	if err != nil {
		t.Fatal(err)
	}
	inter, _ := x509.ParseCertificate(ider)
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	id := spiffeid.ID{TrustDomain: a.td, Role: spiffeid.RoleAgent, Name: "web-7"}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(9), Subject: pkix.Name{CommonName: "web-7"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour), URIs: []*url.URL{id.URL()},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, inter, k.Public(), ik)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	// Presented alone, as an agent presents it to a listener that names
	// its issuer's name among the acceptable ones.
	conn := a.dial(&identity.Identity{Chain: []*x509.Certificate{leaf}, Key: k, Roots: []*x509.Certificate{a.h.Root}})
	_, err = musterv1.NewAgentServiceClient(conn).GetVerifierSet(t.Context(), &musterv1.GetVerifierSetRequest{})
	audited := deniedAudit(t, a, "/muster.v1.AgentService/GetVerifierSet")
	const join = "muster agent join --force --data ADIR --node web-7 with a joining URI from muster token create --node web-7"
	if msg := status.Convert(err).Message(); status.Code(err) != codes.Unauthenticated ||
		!strings.Contains(msg, "restored from a backup") || !strings.Contains(msg, join) {
		t.Errorf("a leaf of an unheld agent intermediate: %v, want UNAUTHENTICATED naming the restore and %q", err, join)
	}
	if !strings.Contains(audited, join) {
		t.Errorf("audited reason %q does not name the join", audited)
	}
	// Presented with an intermediate that is not under this authority's
	// root (a client this package's does not leave it out for), it is
	// another authority's, whatever the names say.
	_, err = a.srvs[0].verifyClientCertsAt([]*x509.Certificate{leaf, inter}, time.Now())
	if err == nil || strings.Contains(err.Error(), "restored") || !strings.Contains(err.Error(), "muster admin add") {
		t.Errorf("a leaf with a foreign intermediate of this authority's name: %v, want the foreign certificate's refusal", err)
	}
}
