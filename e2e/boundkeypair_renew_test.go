package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/agent"
	"github.com/muster-dev/muster/internal/errinfo"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestBoundKeypairRenewEndsWithTheToken: through the built binary, muster
// agent renew on a bound-keypair agent refreshes by the challenge (same
// instance, nothing consumed); the certificate key alone cannot renew over
// mTLS (RequestCertificate is refused challenge_required); and once the
// token is deleted, agent renew and agent run both fail NOT_FOUND, as the
// operator guide's table says. On both stores.
func TestBoundKeypairRenewEndsWithTheToken(t *testing.T) {
	t.Parallel()
	t.Run("sqlite", func(t *testing.T) { renewEndsWithTheToken(t, newAgentEnv(t, "--agent-cert-ttl", "6s")) })
	t.Run("postgres", func(t *testing.T) {
		url := postgres(t)
		dir, out := initDir(t, "--store", url)
		e := &agentEnv{dir: dir, auth: startAuthority(t, dir, "--agent-cert-ttl", "6s", "--store", url)}
		e.authorityID, _ = out["authority_id"].(string)
		e.fingerprint, _ = out["ca_fingerprint"].(string)
		renewEndsWithTheToken(t, e)
	})
}

func renewEndsWithTheToken(t *testing.T, e *agentEnv) {
	je := &joinEnv{dir: e.dir, auth: e.auth}
	je.setup(t)

	adir := filepath.Join(t.TempDir(), "agent")
	_, keyFile := keypairFile(t, adir)
	mustRun(t, "bot", "add", "runner", "--public-key", keyFile, "--recovery-limit", "2", "--data", e.dir)
	mustRun(t, "agent", "join", "--data", adir, "--bound-keypair", "runner", "--authority", e.auth.addr,
		"--ca-fingerprint", e.fingerprint)
	joined := agentState(t, adir)

	mustRun(t, "agent", "renew", "--data", adir)
	renewed := agentState(t, adir)
	if renewed.InstanceID != joined.InstanceID || renewed.Serial == joined.Serial || renewed.Generation != 1 {
		t.Fatalf("agent renew: instance %s generation %d serial %s (joined: %s, %s)", renewed.InstanceID, renewed.Generation,
			renewed.Serial, joined.InstanceID, joined.Serial)
	}
	if n := recoveryCount(t, e.dir, "runner"); n != 1 {
		t.Fatalf("recovery_count after agent renew = %d, want 1", n)
	}

	// Whoever holds certs/agent.key (and not keys/bound.key) cannot renew.
	id, err := agent.Dir(adir).LoadIdentity()
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	_, err = musterv1.NewCertificateServiceClient(je.dial(t, id)).RequestCertificate(t.Context(),
		&musterv1.RequestCertificateRequest{Csr: csrOf(t, key, x509.CertificateRequest{})})
	if status.Code(err) != codes.FailedPrecondition || errinfo.Reason(err) != "challenge_required" {
		t.Fatalf("a plain renewal of a bound-keypair agent: %v (reason %q), want FAILED_PRECONDITION challenge_required", err, errinfo.Reason(err))
	}
	if st := agentState(t, adir); st.Generation != 1 {
		t.Fatalf("generation %d after the refused renewal", st.Generation)
	}

	mustRun(t, "token", "delete", "runner", "--data", e.dir)
	const gone = "NOT_FOUND: unknown bound-keypair token, or not for this node"
	if msg := mustFail(t, "agent", "renew", "--data", adir); !strings.Contains(msg, "refresh failed: "+gone) {
		t.Fatalf("agent renew after token delete: %s", msg)
	} else if want := "muster bot add runner --recovery-limit 2 for a new registration secret, then here muster agent join --force --data " + adir + " --bound-keypair runner"; !strings.Contains(msg, want) {
		t.Errorf("agent renew after token delete: %s, want the way out %q", msg, want)
	}
	r := muster(t, nil, "agent", "run", "--data", adir, "--log-format", "json")
	if r.code == 0 || !strings.Contains(r.stderr, "muster: refresh failed: "+gone) {
		t.Fatalf("agent run after token delete: exit %d\n%s", r.code, r.stderr)
	}
	if st := agentState(t, adir); st.Generation != 1 {
		t.Fatalf("generation %d after the token was deleted", st.Generation)
	}
}

// TestBoundKeypairSpentSecret: a second machine given a registration
// secret already used is refused FAILED_PRECONDITION registration_closed
// (the operator guide: delete the token and bot add again), and keeps no
// certificate.
func TestBoundKeypairSpentSecret(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	var reg botInfo
	if err := json.Unmarshal([]byte(mustRun(t, "bot", "add", "builder", "--data", e.dir, "-o", "json")), &reg); err != nil {
		t.Fatal(err)
	}
	if r := muster(t, []string{"MUSTER_JOIN_URI=" + reg.URI}, "agent", "join", "--data", filepath.Join(t.TempDir(), "first")); r.code != 0 {
		t.Fatalf("first join: exit %d\n%s", r.code, r.stderr)
	}
	second := filepath.Join(t.TempDir(), "second")
	r := muster(t, []string{"MUSTER_JOIN_URI=" + reg.URI}, "agent", "join", "--data", second)
	if r.code == 0 || !strings.Contains(r.stderr, "FAILED_PRECONDITION: registration_closed") {
		t.Fatalf("a second machine with the used secret: exit %d\n%s", r.code, r.stderr)
	}
	assertNoAgentCerts(t, second)
}
