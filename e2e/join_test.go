package e2e

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	pkcs12 "software.sslmate.com/src/go-pkcs12"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/jointoken"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/trustbundle"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// joinEnv is an authority with what a test needs to call it as an agent.
type joinEnv struct {
	dir  string
	auth *authorityProc
	td   string
	root *x509.Certificate
	boot musterv1.BootstrapServiceClient
}

func newJoinEnv(t *testing.T, extra ...string) *joinEnv {
	t.Helper()
	dir, _ := initDir(t)
	e := &joinEnv{dir: dir, auth: startAuthority(t, dir, extra...)}
	e.setup(t)
	return e
}

// setup reads what an agent would pin from the data directory.
func (e *joinEnv) setup(t *testing.T) {
	t.Helper()
	h, err := ca.Load(filepath.Join(e.dir, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		TrustDomain string `json:"trust_domain"`
		AuthorityID string `json:"authority_id"`
	}
	data, err := os.ReadFile(filepath.Join(e.dir, "authority.json"))
	if err != nil || json.Unmarshal(data, &info) != nil {
		t.Fatalf("authority.json: %v", err)
	}
	e.td, e.root = info.AuthorityID, h.Root
	e.boot = musterv1.NewBootstrapServiceClient(e.dial(t, nil))
}

// dial connects as an agent would after pinning the root: the server must
// carry the authority's SPIFFE ID.
func (e *joinEnv) dial(t *testing.T, id *identity.Identity) *grpc.ClientConn {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(e.root)
	want, _ := spiffeid.New(e.td, spiffeid.RoleAuthority, e.td)
	conn, err := grpc.NewClient(e.auth.addr, grpc.WithTransportCredentials(credentials.NewTLS(identity.ClientTLS(id, pool, identity.MatchID(want)))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func (e *joinEnv) token(t *testing.T, args ...string) string {
	t.Helper()
	var out struct {
		Token string `json:"token"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, append([]string{"token", "create", "--data", e.dir, "-o", "json"}, args...)...)), &out); err != nil {
		t.Fatal(err)
	}
	return out.Token
}

func (e *joinEnv) tokenInfo(t *testing.T, id string) map[string]any {
	t.Helper()
	var out map[string]any
	if err := json.Unmarshal([]byte(mustRun(t, "token", "get", id, "--data", e.dir, "-o", "json")), &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func newCSR(t testing.TB) (*ecdsa.PrivateKey, []byte) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	return key, der
}

// agentID turns an issued chain and its key into an identity for mTLS.
func (e *joinEnv) agentID(t *testing.T, chainPEM string, key crypto.Signer) *identity.Identity {
	t.Helper()
	chain, err := ca.ParseCertsPEM([]byte(chainPEM))
	if err != nil {
		t.Fatal(err)
	}
	return &identity.Identity{Chain: chain, Key: key, Roots: []*x509.Certificate{e.root}}
}

func (e *joinEnv) join(t *testing.T, token, node string) (*identity.Identity, *musterv1.ExchangeJoinTokenResponse) {
	t.Helper()
	key, csr := newCSR(t)
	resp, err := e.boot.ExchangeJoinToken(t.Context(), &musterv1.ExchangeJoinTokenRequest{JoinToken: token, NodeId: node, Csr: csr})
	if err != nil {
		t.Fatalf("join %s: %v", node, err)
	}
	return e.agentID(t, resp.GetCertificateChainPem(), key), resp
}

func (e *joinEnv) renew(t *testing.T, id *identity.Identity, csr []byte) (*musterv1.RequestCertificateResponse, error) {
	t.Helper()
	return musterv1.NewCertificateServiceClient(e.dial(t, id)).RequestCertificate(t.Context(), &musterv1.RequestCertificateRequest{Csr: csr})
}

func wantCode(t *testing.T, err error, code codes.Code, msg string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), msg) {
		t.Fatalf("got %v, want %v containing %q", err, code, msg)
	}
}

// TestExchangeCheckOrder walks DESIGN.md's table of refusals in order: each
// case fails exactly one check, and gets that check's code.
func TestExchangeCheckOrder(t *testing.T) {
	t.Parallel()
	e := newJoinEnv(t)
	good := e.token(t, "--uses", "5")
	id := good[:6]
	spent := e.token(t, "--uses", "1")
	e.join(t, spent, "spender")
	expired := e.token(t, "--ttl", "1s")
	bound := e.token(t, "--node", "bound-node", "--uses", "3")
	taken := e.token(t)
	e.join(t, taken, "taken-node")
	lockedTok := e.token(t)
	mustRun(t, "lock", "create", "--token", lockedTok[:6], "--data", e.dir)
	mustRun(t, "lock", "create", "--node", "locked-node", "--data", e.dir)
	time.Sleep(1100 * time.Millisecond) // let the 1s token expire
	_, csr := newCSR(t)

	tests := []struct {
		name, token, node string
		csr               []byte
		code              codes.Code
		msg               string
	}{
		{"malformed token", "not-a-token", "n1", csr, codes.InvalidArgument, "malformed"},
		{"missing node", good, "", csr, codes.InvalidArgument, "required"},
		{"bad node ID", good, "Bad_Node", csr, codes.InvalidArgument, "node_id"},
		{"bad CSR", good, "n1", []byte("junk"), codes.InvalidArgument, "csr"},
		{"unknown token", "zzzzzz.0123456789abcdef", "n1", csr, codes.NotFound, "unknown join token"},
		{"wrong secret", id + ".0123456789abcdef", "n1", csr, codes.NotFound, "unknown join token"},
		{"used up", spent, "n1", csr, codes.FailedPrecondition, "no uses left"},
		{"expired", expired, "n1", csr, codes.FailedPrecondition, "expired"},
		{"bound to another node", bound, "n1", csr, codes.PermissionDenied, "bound to another node"},
		{"node taken", good, "taken-node", csr, codes.AlreadyExists, "already exists"},
		{"locked token", lockedTok, "n1", csr, codes.PermissionDenied, "locked"},
		{"locked node", good, "locked-node", csr, codes.PermissionDenied, "locked"},
	}
	// The ErrorInfo reasons tools match on instead of the messages.
	tokenReasons := map[string]string{"used up": "token_used_up", "expired": "token_expired",
		"bound to another node": "token_bound_elsewhere", "node taken": "node_taken", "locked token": "locked", "unknown token": "not_found"}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.boot.ExchangeJoinToken(t.Context(), &musterv1.ExchangeJoinTokenRequest{JoinToken: tt.token, NodeId: tt.node, Csr: tt.csr})
			wantCode(t, err, tt.code, tt.msg)
			if r, ok := tokenReasons[tt.name]; ok {
				wantReason(t, err, r)
			}
		})
	}
	// A refused attempt consumes nothing.
	if got := e.tokenInfo(t, id)["uses_count"]; got != 0.0 {
		t.Errorf("uses_count after refusals = %v, want 0", got)
	}
	// Refusals are audited with the token ID and never the secret.
	audit := mustRun(t, "audit", "list", "--data", e.dir, "--action", "agent.join", "-o", "json")
	if !strings.Contains(audit, "token:"+id) || strings.Contains(audit, good[7:]) {
		t.Errorf("join refusals audit: want token:%s and no secret:\n%s", id, audit)
	}
	if _, resp := e.join(t, good, "n1"); resp.GetInstanceId() == "" {
		t.Error("no instance ID in the response")
	}
}

// TestExchangeRace: many exchanges at once on a k-use token give exactly k
// certificates.
func TestExchangeRace(t *testing.T) {
	t.Parallel()
	e := newJoinEnv(t)
	const k, n = 3, 16
	tok := e.token(t, "--uses", "3")
	var wg sync.WaitGroup
	codesSeen := make(chan codes.Code, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, csr := newCSR(t)
			_, err := e.boot.ExchangeJoinToken(context.Background(), &musterv1.ExchangeJoinTokenRequest{
				JoinToken: tok, NodeId: "racer-" + string(rune('a'+i)), Csr: csr})
			codesSeen <- status.Code(err)
		}()
	}
	wg.Wait()
	close(codesSeen)
	got := map[codes.Code]int{}
	for c := range codesSeen {
		got[c]++
	}
	if got[codes.OK] != k || got[codes.FailedPrecondition] != n-k {
		t.Fatalf("results %v, want %d OK and %d FAILED_PRECONDITION", got, k, n-k)
	}
	if uses := e.tokenInfo(t, tok[:6])["uses_count"]; uses != float64(k) {
		t.Fatalf("uses_count = %v, want %d", uses, k)
	}
}

func TestExchangeRetryAndKeystore(t *testing.T) {
	t.Parallel()
	e := newJoinEnv(t)
	tok := e.token(t)
	_, csr := newCSR(t)
	req := &musterv1.ExchangeJoinTokenRequest{JoinToken: tok, NodeId: "n1", Csr: csr}
	first, err := e.boot.ExchangeJoinToken(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	// The reply was lost: the same request gets the same certificate, and
	// the single-use token is not spent twice.
	again, err := e.boot.ExchangeJoinToken(t.Context(), req)
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	if again.GetCertificateChainPem() != first.GetCertificateChainPem() {
		t.Fatal("retry got a different certificate")
	}
	// A different key is a different request: the token is used up.
	_, other := newCSR(t)
	_, err = e.boot.ExchangeJoinToken(t.Context(), &musterv1.ExchangeJoinTokenRequest{JoinToken: tok, NodeId: "n1", Csr: other})
	wantCode(t, err, codes.FailedPrecondition, "no uses left")

	// Without a CSR the authority mints the key and fills a keystore.
	resp, err := e.boot.ExchangeJoinToken(t.Context(), &musterv1.ExchangeJoinTokenRequest{JoinToken: e.token(t), NodeId: "keystore"})
	if err != nil {
		t.Fatal(err)
	}
	key, leaf, _, err := pkcs12.DecodeChain(resp.GetPkcs12(), resp.GetPkcs12Password())
	if err != nil {
		t.Fatalf("keystore: %v", err)
	}
	chain, _ := ca.ParseCertsPEM([]byte(resp.GetCertificateChainPem()))
	if !leaf.Equal(chain[0]) || !key.(*ecdsa.PrivateKey).PublicKey.Equal(leaf.PublicKey) {
		t.Fatal("keystore does not hold the issued certificate and its key")
	}
	if leaf.URIs[0].String() != "spiffe://"+e.td+"/agent/keystore" || leaf.Subject.CommonName != "keystore" || leaf.IsCA {
		t.Fatalf("agent certificate fields: %v %q", leaf.URIs, leaf.Subject.CommonName)
	}

	body := metricsOf(t, e.auth.metrics)
	for _, want := range []string{
		`muster_joins_total{method="token",result="ok"} 2`,
		`muster_joins_total{method="token",result="retry"} 1`,
		`muster_joins_total{method="token",result="failed_precondition"} 1`,
		`muster_certificates_issued_total{kind="join"} 2`,
		`muster_tokens{state="used_up"} 2`,
		"muster_issuance_duration_seconds_bucket",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func TestTrustBundle(t *testing.T) {
	t.Parallel()
	e := newJoinEnv(t)
	tok := e.token(t)
	parsed, _ := jointoken.Parse(tok)
	resp, err := e.boot.GetTrustBundle(t.Context(), &musterv1.GetTrustBundleRequest{TokenId: parsed.ID})
	if err != nil {
		t.Fatal(err)
	}
	v, err := trustbundle.Verify(resp.GetJws(), parsed.ID, trustbundle.Key(parsed.ID, parsed.Secret()))
	if err != nil {
		t.Fatalf("bundle does not verify with the token: %v", err)
	}
	if v.AuthorityID != e.td || !v.RootCerts[0].Equal(e.root) || len(v.Endpoints) != 1 || v.Endpoints[0] != e.auth.addr {
		t.Fatalf("bundle %+v", v.Bundle)
	}
	// An unknown ID gets an answer too, which no guessed secret verifies.
	resp, err = e.boot.GetTrustBundle(t.Context(), &musterv1.GetTrustBundleRequest{TokenId: "zzzzzz"})
	if err != nil {
		t.Fatalf("unknown token ID: %v", err)
	}
	if _, err := trustbundle.Verify(resp.GetJws(), "zzzzzz", trustbundle.Key("zzzzzz", parsed.Secret())); err == nil {
		t.Fatal("decoy bundle verified")
	}
	_, err = e.boot.GetTrustBundle(t.Context(), &musterv1.GetTrustBundleRequest{TokenId: "x"})
	wantCode(t, err, codes.InvalidArgument, "token_id")
}

func TestRenewalGenerationsAndCopies(t *testing.T) {
	t.Parallel()
	e := newJoinEnv(t)
	gen0, _ := e.join(t, e.token(t), "n1")

	k1, csr1 := newCSR(t)
	r1, err := e.renew(t, gen0, csr1)
	if err != nil || r1.GetGeneration() != 1 {
		t.Fatalf("renewal: %v, generation %d", err, r1.GetGeneration())
	}
	// The reply was lost: generation 0 with the key already certified for
	// generation 1 gets that certificate again.
	retry, err := e.renew(t, gen0, csr1)
	if err != nil || retry.GetCertificateChainPem() != r1.GetCertificateChainPem() {
		t.Fatalf("retry: %v", err)
	}
	gen1 := e.agentID(t, r1.GetCertificateChainPem(), k1)
	_, csr2 := newCSR(t)
	r2, err := e.renew(t, gen1, csr2)
	if err != nil || r2.GetGeneration() != 2 {
		t.Fatalf("second renewal: %v", err)
	}
	// A copy of generation 1 with a new key: the identity was copied.
	_, csr3 := newCSR(t)
	_, err = e.renew(t, gen1, csr3)
	wantCode(t, err, codes.PermissionDenied, "copy_detected")
	wantReason(t, err, "copy_detected")
	// The instance is now locked, for every holder.
	_, err = e.renew(t, gen0, csr1)
	wantCode(t, err, codes.PermissionDenied, "locked")
	wantReason(t, err, "locked")

	var locks []map[string]any
	json.Unmarshal([]byte(mustRun(t, "lock", "list", "--data", e.dir, "-o", "json")), &locks)
	if len(locks) != 1 || locks[0]["kind"] != "instance" || !strings.Contains(locks[0]["reason"].(string), "copy_detected") {
		t.Fatalf("locks after a copy: %v", locks)
	}
	// A lock on an instance never affects the node's later instances.
	bound := e.token(t, "--node", "n1")
	next, _ := e.join(t, bound, "n1")
	if _, err := e.renew(t, next, must2(newCSR(t))); err != nil {
		t.Fatalf("new instance after a locked one: %v", err)
	}
}

func must2[A, B any](_ A, b B) B { return b }

func TestNodeLifecycle(t *testing.T) {
	t.Parallel()
	e := newJoinEnv(t)
	tok := e.token(t, "--uses", "2", "--node", "n1")
	first, _ := e.join(t, tok, "n1")
	// The token is deleted: the node keeps renewing.
	mustRun(t, "token", "delete", tok[:6], "--data", e.dir)
	if _, err := e.renew(t, first, must2(newCSR(t))); err != nil {
		t.Fatalf("renewal after the token was deleted: %v", err)
	}
	// A bound token re-provisions: the old instance is superseded.
	second, _ := e.join(t, e.token(t, "--node", "n1"), "n1")
	_, err := e.renew(t, first, must2(newCSR(t)))
	wantCode(t, err, codes.PermissionDenied, "superseded")
	wantReason(t, err, "superseded")
	// Deleted: cannot renew; the node ID is free for a new token.
	mustRun(t, "agents", "delete", "n1", "--data", e.dir)
	_, err = e.renew(t, second, must2(newCSR(t)))
	wantCode(t, err, codes.PermissionDenied, "deleted")
	wantReason(t, err, "deleted")
	third, _ := e.join(t, e.token(t), "n1")
	if _, err := e.renew(t, third, must2(newCSR(t))); err != nil {
		t.Fatalf("renewal after re-joining: %v", err)
	}
	// agents show keeps the whole history.
	var show struct {
		Agent        map[string]any   `json:"agent"`
		Instances    []map[string]any `json:"instances"`
		Certificates []map[string]any `json:"certificates"`
	}
	json.Unmarshal([]byte(mustRun(t, "agents", "show", "n1", "--data", e.dir, "-o", "json")), &show)
	if len(show.Instances) != 3 || len(show.Certificates) != 5 || show.Agent["generation"] != 1.0 {
		t.Fatalf("agents show: %d instances, %d certificates, agent %v", len(show.Instances), len(show.Certificates), show.Agent)
	}
	states := []string{}
	for _, i := range show.Instances {
		states = append(states, i["state"].(string))
	}
	if strings.Join(states, ",") != "superseded,deleted,current" {
		t.Fatalf("instance states %v", states)
	}
	// An agent certificate cannot call the admin API, and an operator
	// certificate cannot renew.
	_, err = musterv1.NewAdminServiceClient(e.dial(t, third)).ListTokens(t.Context(), &musterv1.ListTokensRequest{})
	wantCode(t, err, codes.PermissionDenied, "")
	wantReason(t, err, "permission_denied")
	op, _ := identity.Load(filepath.Join(e.dir, "operator.pem"))
	_, err = e.renew(t, op, must2(newCSR(t)))
	wantCode(t, err, codes.PermissionDenied, "agent")
	// Without a certificate RequestCertificate is a PSK bootstrap, not a
	// renewal: without the PSK it is refused as such.
	_, err = e.renew(t, nil, must2(nodeCSR(t, "n9")))
	wantCode(t, err, codes.PermissionDenied, "bootstrap PSK is missing")
	wantReason(t, err, "psk_missing")
}

func TestBootstrapRateLimit(t *testing.T) {
	e := newJoinEnv(t)
	var limited bool
	for range 60 {
		_, err := e.boot.ExchangeJoinToken(t.Context(), &musterv1.ExchangeJoinTokenRequest{JoinToken: "zzzzzz.0123456789abcdef", NodeId: "n"})
		if status.Code(err) == codes.ResourceExhausted {
			limited = true
			break
		}
		if status.Code(err) != codes.NotFound {
			t.Fatalf("unexpected %v", err)
		}
	}
	if !limited {
		t.Fatal("60 bad exchanges from one source were never rate limited")
	}
	// Oversized requests are refused before they are parsed.
	_, err := e.boot.ExchangeJoinToken(t.Context(), &musterv1.ExchangeJoinTokenRequest{JoinToken: "x", NodeId: "n", Csr: make([]byte, 128<<10)})
	wantCode(t, err, codes.ResourceExhausted, "")
}

func TestTokenCommands(t *testing.T) {
	t.Parallel()
	e := newJoinEnv(t)
	out := mustRun(t, "token", "create", "--data", e.dir, "--description", "rack 4", "--label", "env=prod", "--uses", "2")
	if !strings.Contains(out, "muster+token://") || !strings.Contains(out, "fingerprint=sha256") {
		t.Errorf("token create output lacks the joining URI:\n%s", out)
	}
	list := mustRun(t, "token", "list", "--data", e.dir)
	if !strings.Contains(list, "rack 4") || !strings.Contains(list, "env=prod") {
		t.Errorf("token list:\n%s", list)
	}
	var toks []map[string]any
	json.Unmarshal([]byte(mustRun(t, "token", "list", "--data", e.dir, "-o", "json")), &toks)
	for _, tk := range toks {
		if _, ok := tk["token"]; ok {
			t.Errorf("token list shows a secret: %v", tk)
		}
	}
	line := mustFail(t, "token", "create", "--data", e.dir, "--ttl", "0", "--uses", "0")
	if !strings.Contains(line, "INVALID_ARGUMENT") || !strings.Contains(line, "--unsafe-unlimited") {
		t.Errorf("unlimited token without --unsafe-unlimited: %q", line)
	}
	r := muster(t, nil, "token", "create", "--data", e.dir, "--ttl", "0", "--uses", "0", "--unsafe-unlimited")
	if r.code != 0 || !strings.Contains(r.stderr, "warning") {
		t.Errorf("--unsafe-unlimited: exit %d, stderr %q", r.code, r.stderr)
	}
	if line := mustFail(t, "token", "delete", "zzzzzz", "--data", e.dir); !strings.Contains(line, "NOT_FOUND") {
		t.Errorf("delete of an unknown token: %q", line)
	}
}

// TestLocksRefuseRenewal: a lock on the node, the instance or the token
// that admitted it stops renewals, and deleting the lock lets them go on.
func TestLocksRefuseRenewal(t *testing.T) {
	t.Parallel()
	e := newJoinEnv(t)
	for _, kind := range []string{"node", "instance", "token"} {
		t.Run(kind, func(t *testing.T) {
			tok := e.token(t)
			node := "locked-" + kind
			id, resp := e.join(t, tok, node)
			target := map[string]string{"node": node, "instance": resp.GetInstanceId(), "token": tok[:6]}[kind]
			var lock map[string]any
			json.Unmarshal([]byte(mustRun(t, "lock", "create", "--"+kind, target, "--reason", "test", "--data", e.dir, "-o", "json")), &lock)
			_, err := e.renew(t, id, must2(newCSR(t)))
			wantCode(t, err, codes.PermissionDenied, "locked")
			mustRun(t, "lock", "delete", lock["id"].(string), "--data", e.dir)
			if _, err := e.renew(t, id, must2(newCSR(t))); err != nil {
				t.Fatalf("renewal after the lock was deleted: %v", err)
			}
		})
	}
}

// TestLockedRenewalNamesOneLock: a renewal refused by several locks is
// audited as a renewal (not as a refused API call) naming the lock on the
// node, the first of its targets, every time.
func TestLockedRenewalNamesOneLock(t *testing.T) {
	t.Parallel()
	e := newJoinEnv(t)
	tok := e.token(t)
	id, resp := e.join(t, tok, "twice-locked")
	var lock map[string]any
	mustRun(t, "lock", "create", "--instance", resp.GetInstanceId(), "--data", e.dir)
	json.Unmarshal([]byte(mustRun(t, "lock", "create", "--node", "twice-locked", "--data", e.dir, "-o", "json")), &lock)
	mustRun(t, "lock", "create", "--token", tok[:6], "--data", e.dir)
	for range 2 {
		_, err := e.renew(t, id, must2(newCSR(t)))
		wantCode(t, err, codes.PermissionDenied, "locked")
	}
	var recs []map[string]any
	json.Unmarshal([]byte(mustRun(t, "audit", "list", "--data", e.dir, "--action", "agent.renew", "-o", "json")), &recs)
	want := "locked: lock " + lock["id"].(string) + " on node twice-locked; muster lock delete " + lock["id"].(string) + " lifts it (muster lock list says why it was made)"
	if len(recs) != 2 {
		t.Fatalf("agent.renew records: %v, want 2", recs)
	}
	for _, r := range recs {
		if r["result"] != "denied" || r["reason"] != want {
			t.Errorf("renewal record %v, want denied with reason %q", r, want)
		}
	}
	if a := mustRun(t, "audit", "list", "--data", e.dir, "--action", "api.access", "-o", "json"); strings.Contains(a, "twice-locked") {
		t.Errorf("the locked renewal was refused before the renewal: %s", a)
	}
}

// TestLocksOnKeysAndPastedSecrets: a lock on a public key (as agents show
// prints it) refuses renewals of that key; a join token pasted whole where
// an ID is wanted is refused or cut to its ID, and never reaches the audit
// log.
func TestLocksOnKeysAndPastedSecrets(t *testing.T) {
	t.Parallel()
	e := newJoinEnv(t)
	_, csr := newCSR(t)
	id, _ := e.join(t, e.token(t), "keyed")
	var show struct {
		Certificates []map[string]any `json:"certificates"`
	}
	json.Unmarshal([]byte(mustRun(t, "agents", "show", "keyed", "--data", e.dir, "-o", "json")), &show)
	held := show.Certificates[0]["public_key_sha256"].(string)
	mustRun(t, "lock", "create", "--public-key", held, "--data", e.dir)
	_, err := e.renew(t, id, csr)
	wantCode(t, err, codes.PermissionDenied, "locked")

	tok := e.token(t)
	for _, args := range [][]string{
		{"lock", "create", "--token", tok},
		{"lock", "create", "--public-key", "not-hex"},
	} {
		mustFail(t, append(args, "--data", e.dir)...)
	}
	// The CLI deletes by the ID part of a pasted token.
	mustRun(t, "token", "delete", tok, "--data", e.dir)
	if audit := mustRun(t, "audit", "list", "--data", e.dir, "-o", "json"); strings.Contains(audit, tok[7:]) {
		t.Fatal("a pasted token secret reached the audit log")
	}
}
