package e2e

import (
	"crypto/x509"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/spiffeid"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// operatorAdmin is the admin API as the operator init created.
func operatorAdmin(t *testing.T, dir, addr string) musterv1.AdminServiceClient {
	t.Helper()
	op, err := identity.Load(filepath.Join(dir, "operator.pem"))
	if err != nil {
		t.Fatal(err)
	}
	return dialAdmin(t, dir, addr, op)
}

// TestAdminInputsAreBounded: a lock target that names nothing a join or
// renewal could match, and an audit page size out of range, are refused
// with INVALID_ARGUMENT and a reason, audited, and change nothing.
func TestAdminInputsAreBounded(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	auth := startAuthority(t, dir)
	c := operatorAdmin(t, dir, auth.addr)
	for _, tt := range []struct{ kind, target, want string }{
		{"node", "../x", "name"},
		{"node", "Node-1", "name"},
		{"admin", "a/b", "name"},
		{"instance", "../x", "UUID"},
		{"instance", "0AF1E2D3-0000-4000-8000-000000000000", "UUID"},
		{"token", "ABCDEF", "6 of a-z 0-9"},
		{"token", "abc", "6 of a-z 0-9"},
	} {
		_, err := c.CreateLock(t.Context(), &musterv1.CreateLockRequest{Kind: tt.kind, Target: tt.target})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tt.want) {
			t.Errorf("lock %s %q: %v, want INVALID_ARGUMENT naming %q", tt.kind, tt.target, err, tt.want)
		}
	}
	if l, err := c.ListLocks(t.Context(), &musterv1.ListLocksRequest{}); err != nil || len(l.GetLocks()) != 0 {
		t.Fatalf("locks after refusals: %v, %v", l.GetLocks(), err)
	}
	for _, limit := range []int32{-1, 1001} {
		_, err := c.ListAudit(t.Context(), &musterv1.ListAuditRequest{Limit: limit})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "limit") {
			t.Errorf("ListAudit limit %d: %v, want INVALID_ARGUMENT", limit, err)
		}
	}
	if r, err := c.ListAudit(t.Context(), &musterv1.ListAuditRequest{Limit: 2}); err != nil || len(r.GetRecords()) != 2 {
		t.Fatalf("ListAudit limit 2: %d records, %v", len(r.GetRecords()), err)
	}
	out := mustRun(t, "audit", "list", "--data", dir, "-o", "json")
	if got := strings.Count(out, `"lock.create"`); got != 7 {
		t.Errorf("%d lock.create records, want the 7 refusals", got)
	}
	if got := strings.Count(out, `"audit.list"`); got != 2 {
		t.Errorf("%d audit.list records, want the 2 refusals", got)
	}
}

// TestClientCertificateRefusals: a client certificate that does not verify
// (expired, or from another authority) is answered UNAUTHENTICATED with
// the reason, on renewal and on the admin API alike, and audited; it is
// never a failed handshake (which clients see as UNAVAILABLE) nor taken as
// an anonymous bootstrap.
func TestClientCertificateRefusals(t *testing.T) {
	t.Parallel()
	e := newJoinEnv(t)
	h, err := ca.Load(filepath.Join(e.dir, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	otherDir, _ := initDir(t)
	other, err := ca.Load(filepath.Join(otherDir, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	cert := func(issuer *ca.Issuer, root *x509.Certificate, role spiffeid.Role, name string, notBefore time.Time) *identity.Identity {
		key, _ := newCSR(t)
		id, _ := spiffeid.New(e.td, role, name)
		leaf, err := issuer.Issue(ca.LeafRequest{PublicKey: key.Public(), SPIFFEID: id.URL(), CommonName: name, ClientAuth: true,
			NotBefore: notBefore, TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return &identity.Identity{Chain: []*x509.Certificate{leaf, issuer.Cert}, Key: key, Roots: []*x509.Certificate{root}}
	}
	_, csr := newCSR(t)
	for _, tt := range []struct {
		name string
		id   *identity.Identity
		want string
	}{
		{"expired agent", cert(h.Issuer(ca.RoleAgent), h.Root, spiffeid.RoleAgent, "n1", time.Now().Add(-3*time.Hour)), "expired"},
		{"foreign agent", cert(other.Issuer(ca.RoleAgent), other.Root, spiffeid.RoleAgent, "n1", time.Now()), "not issued by this authority"},
	} {
		_, err := e.renew(t, tt.id, csr)
		wantCode(t, err, codes.Unauthenticated, tt.want)
		_, err = musterv1.NewAdminServiceClient(e.dial(t, tt.id)).ListTokens(t.Context(), &musterv1.ListTokensRequest{})
		wantCode(t, err, codes.Unauthenticated, tt.want)
	}
	expiredOp := cert(h.Issuer(ca.RoleAdmin), h.Root, spiffeid.RoleAdmin, "alice", time.Now().Add(-3*time.Hour))
	_, err = dialAdmin(t, e.dir, e.auth.addr, expiredOp).GetStatus(t.Context(), &musterv1.GetStatusRequest{})
	wantCode(t, err, codes.Unauthenticated, "expired")
	forgedOp := cert(other.Issuer(ca.RoleAdmin), other.Root, spiffeid.RoleAdmin, "bob", time.Now())
	_, err = dialAdmin(t, e.dir, e.auth.addr, forgedOp).GetStatus(t.Context(), &musterv1.GetStatusRequest{})
	wantCode(t, err, codes.Unauthenticated, "not issued by this authority")
	// Each refusal is audited with the identity its certificate names,
	// marked: expired: for one this authority issued, claimed: for one it
	// did not (anyone can write a name in a certificate). Before, all were
	// audited as anonymous, and the operator could not tell who tried.
	wantActors := map[string]string{
		"expired:spiffe://" + e.td + "/admin/alice": "expired",
		"expired:spiffe://" + e.td + "/agent/n1":    "expired",
		"claimed:spiffe://" + e.td + "/agent/n1":    "not issued by this authority",
		"claimed:spiffe://" + e.td + "/admin/bob":   "not issued by this authority",
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		recs := auditOf(t, e.dir, "api.access")
		missing := []string{}
		for actor, reason := range wantActors {
			found := false
			for _, r := range recs {
				found = found || (r.Actor == actor && r.Result == "denied" && strings.Contains(r.Reason, reason))
			}
			if !found {
				missing = append(missing, actor)
			}
		}
		if len(missing) == 0 {
			for _, r := range recs {
				if r.Actor == "anonymous" || r.Actor == "spiffe://"+e.td+"/admin/alice" {
					t.Errorf("a refusal audited as %q: %+v", r.Actor, r)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no refusal audited as %v:\n%+v", missing, recs)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// rawCodec sends a []byte as the request body as it is, so a test can send
// what no protobuf encoder would.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return v.([]byte), nil }
func (rawCodec) Unmarshal([]byte, any) error   { return nil }
func (rawCodec) Name() string                  { return "proto" }

// TestUnreadableRequestsAreRefusedAndAudited: a body that is not a
// protobuf message of the method's type is INVALID_ARGUMENT (not
// INTERNAL), one larger than the limit RESOURCE_EXHAUSTED, an unknown
// method UNIMPLEMENTED; each is audited as a refusal, which Refusals
// aggregates under a flood.
func TestUnreadableRequestsAreRefusedAndAudited(t *testing.T) {
	t.Parallel()
	e := newJoinEnv(t)
	conn := e.dial(t, nil)
	call := func(method string, body []byte) error {
		var out []byte
		return conn.Invoke(t.Context(), method, body, &out, grpc.ForceCodec(rawCodec{}))
	}
	const bundle = "/muster.v1.BootstrapService/GetTrustBundle"
	wantCode(t, call(bundle, []byte{0x0a, 0xff, 0x01}), codes.InvalidArgument, "not a valid protobuf message")
	wantCode(t, call(bundle, []byte{0xff}), codes.InvalidArgument, "not a valid protobuf message")
	wantCode(t, call(bundle, make([]byte, 100<<10)), codes.ResourceExhausted, "larger than")
	wantCode(t, call("/muster.v1.BootstrapService/NoSuchMethod", nil), codes.Unimplemented, "unknown method")
	wantCode(t, call("/muster.v1.NoSuchService/X", nil), codes.PermissionDenied, "no access rule")
	// A well-formed request still works.
	if _, err := e.boot.GetTrustBundle(t.Context(), &musterv1.GetTrustBundleRequest{TokenId: "zzzzzz"}); err != nil {
		t.Fatal(err)
	}
	want := []string{"not a valid protobuf message", "larger than", "unknown method", "no access rule"}
	deadline := time.Now().Add(10 * time.Second)
	for {
		out := mustRun(t, "audit", "list", "--data", e.dir, "--action", "api.access", "-o", "json")
		missing := ""
		for _, w := range want {
			if !strings.Contains(out, w) {
				missing = w
			}
		}
		if missing == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no audit record says %q:\n%s", missing, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestAdminReadRefusalsAreAudited: a malformed argument to an admin read
// is INVALID_ARGUMENT and audited (successful reads are not), a pasted
// token secret redacted.
func TestAdminReadRefusalsAreAudited(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	auth := startAuthority(t, dir)
	c := operatorAdmin(t, dir, auth.addr)
	_, err := c.GetToken(t.Context(), &musterv1.GetTokenRequest{Id: "abcdef.secretsecretsecre"})
	wantCode(t, err, codes.InvalidArgument, "token ID")
	_, err = c.GetAgent(t.Context(), &musterv1.GetAgentRequest{NodeId: "../x"})
	wantCode(t, err, codes.InvalidArgument, "node")
	deadline := time.Now().Add(10 * time.Second)
	for {
		out := mustRun(t, "audit", "list", "--data", dir, "-o", "json")
		if strings.Contains(out, "secretsecret") {
			t.Fatalf("the audit log holds the pasted secret:\n%s", out)
		}
		if strings.Contains(out, `"token.get"`) && strings.Contains(out, "abcdef.REDACTED") && strings.Contains(out, `"agent.get"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("refused reads not audited:\n%s", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
