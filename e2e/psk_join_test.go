package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"

	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/psk"
	"github.com/muster-dev/muster/internal/spiffeid"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// pskJoin runs agent join with the bootstrap PSK from the environment.
func pskJoin(t *testing.T, e *agentEnv, adir, node, key, fingerprint string, extra ...string) result {
	t.Helper()
	return muster(t, []string{"MUSTER_BOOTSTRAP_PSK=" + key, "MUSTER_CA_FINGERPRINT=" + fingerprint},
		append([]string{"agent", "join", "--data", adir, "--node", node, "--authority", e.auth.addr, "-o", "json"}, extra...)...)
}

func mustPSKJoin(t *testing.T, e *agentEnv, node, key string) string {
	t.Helper()
	adir := filepath.Join(t.TempDir(), node)
	if r := pskJoin(t, e, adir, node, key, e.fingerprint); r.code != 0 {
		t.Fatalf("PSK join of %s: exit %d\n%s", node, r.code, r.stderr)
	}
	return adir
}

func wantJoinFailure(t *testing.T, r result, code string, msg string) {
	t.Helper()
	if r.code == 0 || !strings.Contains(r.stderr, code) || !strings.Contains(r.stderr, msg) {
		t.Fatalf("join: exit %d, stderr %q; want a failure with %s and %q", r.code, r.stderr, code, msg)
	}
}

func auditJoins(t *testing.T, dir string) string {
	t.Helper()
	return mustRun(t, "audit", "list", "--data", dir, "--action", "agent.join", "-o", "json")
}

func TestPSKJoin(t *testing.T) {
	t.Parallel()
	dir, init := initDir(t)
	e := &agentEnv{dir: dir, auth: startAuthority(t, dir)}
	e.authorityID, _ = init["authority_id"].(string)
	e.fingerprint, _ = init["ca_fingerprint"].(string)
	initPSK := init["bootstrap_psk"].(string)
	initID := showPSKs(t, dir).Active.ID

	// Trust before the secret: a wrong pin is refused before the PSK goes
	// out, so the authority never hears of the attempt.
	wrongFP := "sha256:" + strings.Repeat("0", 64)
	adir := filepath.Join(t.TempDir(), "pinned-wrong")
	r := pskJoin(t, e, adir, "pinned-wrong", initPSK, wrongFP)
	if r.code == 0 || !strings.Contains(r.stderr, "CA fingerprint") || !strings.Contains(r.stderr, "not sent") {
		t.Fatalf("join with a wrong fingerprint: exit %d, %s", r.code, r.stderr)
	}
	assertNoAgentCerts(t, adir)
	if a := auditJoins(t, dir); strings.Contains(a, "pinned-wrong") || strings.Contains(a, "psk") {
		t.Fatalf("the authority recorded a PSK attempt from an agent that pinned another root:\n%s", a)
	}
	// Without a fingerprint the agent does not even try.
	r = muster(t, []string{"MUSTER_BOOTSTRAP_PSK=" + initPSK}, "agent", "join", "--data", adir, "--node", "x", "--authority", e.auth.addr)
	wantJoinFailure(t, r, "", "CA fingerprint")

	// A wrong PSK: PERMISSION_DENIED, nothing written.
	other, _ := psk.Generate()
	adir = filepath.Join(t.TempDir(), "wrong")
	wantJoinFailure(t, pskJoin(t, e, adir, "wrong", other.Reveal(), e.fingerprint), "PERMISSION_DENIED", "bootstrap PSK does not match")
	assertNoAgentCerts(t, adir)

	// The init PSK, from the environment alone.
	adir = filepath.Join(t.TempDir(), "n1")
	r = muster(t, []string{"MUSTER_AGENT_DATA=" + adir, "MUSTER_BOOTSTRAP_PSK=" + initPSK, "MUSTER_CA_FINGERPRINT=" + e.fingerprint,
		"MUSTER_AUTHORITY=" + e.auth.addr, "MUSTER_NODE_ID=n1"}, "agent", "join")
	if r.code != 0 {
		t.Fatalf("PSK join from the environment: exit %d\n%s", r.code, r.stderr)
	}
	st := agentStatus(t, adir)
	if st["node_id"] != "n1" || st["join_method"] != "psk" || st["authority_id"] != e.authorityID ||
		st["authority"] != e.auth.addr || st["spiffe_id"] != "spiffe://"+e.authorityID+"/agent/n1" {
		t.Fatalf("agent status after a PSK join: %v", st)
	}
	cfg, _ := os.ReadFile(filepath.Join(adir, "agent.yaml"))
	if strings.Contains(string(cfg), initPSK[len(psk.Prefix):]) || !strings.Contains(string(cfg), "join_method: psk") {
		t.Errorf("agent.yaml after the PSK join:\n%s", cfg)
	}
	var show struct {
		Agent map[string]any `json:"agent"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "agents", "show", "n1", "--data", dir, "-o", "json")), &show); err != nil ||
		show.Agent["join_method"] != "psk" || show.Agent["token_id"] != initID {
		t.Errorf("agents show n1 does not record join method psk: %v (%v)", show, err)
	}
	a := auditJoins(t, dir)
	if !strings.Contains(a, initID) || !strings.Contains(a, "(active)") || strings.Contains(a, initPSK[len(psk.Prefix):]) {
		t.Errorf("join audit: want PSK %s (active) and never its value:\n%s", initID, a)
	}

	// A PSK-joined agent renews over mTLS like any other.
	mustRun(t, "agent", "renew", "--data", adir)
	if st := agentStatus(t, adir); st["generation"] != 1.0 {
		t.Fatalf("status after renewal: %v", st)
	}

	// The node ID is taken.
	wantJoinFailure(t, pskJoin(t, e, filepath.Join(t.TempDir(), "again"), "n1", initPSK, e.fingerprint), "ALREADY_EXISTS", "already exists")

	// After a rotation with grace, both PSKs join; the old one as grace.
	rot := rotatePSK(t, dir, "--grace", "1h")
	mustPSKJoin(t, e, "n2", rot.Active.PSK)
	uri := "muster+psk://" + strings.TrimPrefix(initPSK, psk.Prefix) + "@" + e.auth.addr + "?fingerprint=" + e.fingerprint
	if r := muster(t, []string{"MUSTER_JOIN_URI=" + uri}, "agent", "join", "--data", filepath.Join(t.TempDir(), "n3"), "--node", "n3"); r.code != 0 {
		t.Fatalf("join with the grace PSK by URI: exit %d\n%s", r.code, r.stderr)
	}
	if a := auditJoins(t, dir); !strings.Contains(a, initID+" (grace)") {
		t.Errorf("join audit does not record the grace PSK %s:\n%s", initID, a)
	}

	// A rotation without grace revokes the PSK it replaces at once (and,
	// told to, the one still in grace).
	rot2 := rotatePSK(t, dir, "--grace", "0", "--revoke-grace")
	wantJoinFailure(t, pskJoin(t, e, filepath.Join(t.TempDir(), "n4"), "n4", rot.Active.PSK, e.fingerprint), "PERMISSION_DENIED", "does not match")
	mustPSKJoin(t, e, "n5", rot2.Active.PSK)

	// The metric counts each validation by result.
	body := metricsOf(t, e.auth.metrics)
	for _, want := range []string{
		`muster_psk_validations_total{result="active"} 4`,
		`muster_psk_validations_total{result="grace"} 1`,
		`muster_psk_validations_total{result="invalid"} 2`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// pskClient calls CertificateService without a client certificate, as a
// bootstrapping agent does after checking the server against the root.
func pskClient(t *testing.T, e *joinEnv, addr string) musterv1.CertificateServiceClient {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(e.root)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(
		identity.ClientTLS(nil, pool, identity.MatchRole(e.td, spiffeid.RoleAuthority)))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return musterv1.NewCertificateServiceClient(conn)
}

func nodeCSR(t *testing.T, cn string) (*ecdsa.PrivateKey, []byte) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return key, der
}

// TestPSKBootstrapCheckOrder walks the PSK bootstrap's checks in order,
// and its retry rule, at the RPC.
func TestPSKBootstrapCheckOrder(t *testing.T) {
	t.Parallel()
	dir, init := initDir(t)
	e := &joinEnv{dir: dir, auth: startAuthority(t, dir, "--bootstrap-listen", "127.0.0.1:0")}
	e.setup(t)
	good := init["bootstrap_psk"].(string)
	c := pskClient(t, e, e.auth.addr)
	_, taken := nodeCSR(t, "taken")
	if _, err := c.RequestCertificate(t.Context(), &musterv1.RequestCertificateRequest{Csr: taken, BootstrapPsk: good}); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "lock", "create", "--node", "locked", "--data", dir)
	other, _ := psk.Generate()
	_, n1 := nodeCSR(t, "n1")
	_, badCN := nodeCSR(t, "Bad_Node")
	_, lockedCSR := nodeCSR(t, "locked")
	_, takenOther := nodeCSR(t, "taken")

	tests := []struct {
		name        string
		csr         []byte
		psk, ticket string
		code        codes.Code
		msg         string
	}{
		{"malformed PSK", n1, "muster-psk:nope", "", codes.InvalidArgument, "malformed"},
		{"referral ticket", n1, good, "eyJ.x.y", codes.InvalidArgument, "discovery service"},
		{"no CSR", nil, good, "", codes.InvalidArgument, "csr"},
		{"bad node ID in the CSR", badCN, good, "", codes.InvalidArgument, "node ID"},
		{"missing PSK", n1, "", "", codes.PermissionDenied, "missing"},
		{"wrong PSK", n1, other.Reveal(), "", codes.PermissionDenied, "does not match"},
		{"node taken, another key", takenOther, good, "", codes.AlreadyExists, "already exists"},
		{"locked node", lockedCSR, good, "", codes.PermissionDenied, "locked"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.RequestCertificate(t.Context(), &musterv1.RequestCertificateRequest{Csr: tt.csr, BootstrapPsk: tt.psk, ReferralTicket: tt.ticket})
			wantCode(t, err, tt.code, tt.msg)
		})
	}

	// A retry (same PSK, node and key) gets the same certificate.
	_, csr := nodeCSR(t, "retry")
	first, err := c.RequestCertificate(t.Context(), &musterv1.RequestCertificateRequest{Csr: csr, BootstrapPsk: good})
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.RequestCertificate(t.Context(), &musterv1.RequestCertificateRequest{Csr: csr, BootstrapPsk: good})
	if err != nil || again.GetCertificateChainPem() != first.GetCertificateChainPem() || again.GetInstanceId() != first.GetInstanceId() {
		t.Fatalf("retry: %v, same certificate %v", err, again.GetCertificateChainPem() == first.GetCertificateChainPem())
	}

	// The bootstrap listener takes PSK bootstraps, and sends renewals to
	// the main address.
	bc := pskClient(t, e, e.auth.bootstrap)
	key, csr := nodeCSR(t, "edge")
	resp, err := bc.RequestCertificate(t.Context(), &musterv1.RequestCertificateRequest{Csr: csr, BootstrapPsk: good})
	if err != nil {
		t.Fatalf("PSK bootstrap on the bootstrap listener: %v", err)
	}
	if eps := resp.GetEndpoints(); len(eps) != 1 || eps[0] != e.auth.addr {
		t.Errorf("endpoints %v, want the main address %s", eps, e.auth.addr)
	}
	id := e.agentID(t, resp.GetCertificateChainPem(), key)
	_, csr2 := nodeCSR(t, "edge")
	pool := x509.NewCertPool()
	pool.AddCert(e.root)
	conn, err := grpc.NewClient(e.auth.bootstrap, grpc.WithTransportCredentials(credentials.NewTLS(
		identity.ClientTLS(id, pool, identity.MatchRole(e.td, spiffeid.RoleAuthority)))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = musterv1.NewCertificateServiceClient(conn).RequestCertificate(t.Context(), &musterv1.RequestCertificateRequest{Csr: csr2})
	wantCode(t, err, codes.PermissionDenied, "bootstraps only")
	if _, err := e.renew(t, id, csr2); err != nil {
		t.Fatalf("renewal of the edge agent at the main address: %v", err)
	}
}

// TestAgentRunJoinsWithPSK: agent run joins from MUSTER_AUTHORITY,
// MUSTER_CA_FINGERPRINT, MUSTER_BOOTSTRAP_PSK and MUSTER_NODE_ID alone.
func TestAgentRunJoinsWithPSK(t *testing.T) {
	t.Parallel()
	dir, init := initDir(t)
	auth := startAuthority(t, dir)
	adir := filepath.Join(t.TempDir(), "agent")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := execCommand(ctx, "agent", "run", "--log-format", "json")
	cmd.Env = append(cmd.Env, "MUSTER_AGENT_DATA="+adir, "MUSTER_AUTHORITY="+auth.addr, "MUSTER_CA_FINGERPRINT="+init["ca_fingerprint"].(string),
		"MUSTER_BOOTSTRAP_PSK="+init["bootstrap_psk"].(string), "MUSTER_NODE_ID=runner")
	logs := &syncWriter{w: &strings.Builder{}}
	logsOnFailure(t, "agent", logs.String)
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(logs.String(), "identity loaded") {
		if time.Now().After(deadline) {
			t.Fatalf("agent run did not join in 30s:\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st := agentStatus(t, adir); st["join_method"] != "psk" || st["node_id"] != "runner" {
		t.Fatalf("status after agent run: %v", st)
	}
}
