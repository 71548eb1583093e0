package agent

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/errinfo"
	"github.com/muster-dev/muster/internal/jointoken"
	"github.com/muster-dev/muster/internal/spiffeid"
)

func TestJoinAcceptsSignedBundle(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	dir := Dir(filepath.Join(t.TempDir(), "agent"))
	if err := dir.WriteConfig(Config{Token: f.token.Reveal(), Node: "n1"}); err != nil {
		t.Fatal(err)
	}
	st, err := newTestAgent(t, dir).Join(t.Context(), f.joinRequest("n1"))
	if err != nil {
		t.Fatalf("join: %v", err)
	}
	if st.NodeID != "n1" || st.InstanceID != "instance-1" || st.AuthorityID != f.aid || st.TrustDomain != f.aid ||
		st.Authority != f.addr || st.JoinMethod != "token" || st.Generation != 0 || st.LastRenewal != nil {
		t.Errorf("state %+v", st)
	}
	if got, _ := dir.ReadState(); got == nil || got.Serial != st.Serial {
		t.Errorf("state.json %+v, want %+v", got, st)
	}
	// Only the ID went out before the authority was verified.
	f.mu.Lock()
	if len(f.bundleReqs) != 1 || f.bundleReqs[0] != f.token.ID || len(f.exchanges) != 1 {
		t.Errorf("bundle requests %v, exchanges %d", f.bundleReqs, len(f.exchanges))
	}
	f.mu.Unlock()
	id, err := dir.LoadIdentity()
	if err != nil {
		t.Fatal(err)
	}
	if sid, _ := id.ID(); sid.String() != "spiffe://"+f.aid+"/agent/n1" || !id.Roots[0].Equal(f.h.Root) {
		t.Errorf("identity %v, roots %v", sid, id.Roots)
	}
	if _, err := os.Stat(dir.PendingKeyFile()); !os.IsNotExist(err) {
		t.Errorf("pending key left after a join: %v", err)
	}
	cfg, err := dir.ReadConfig()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Token != "" || cfg.Authority != f.addr || cfg.Node != "n1" || cfg.JoinMethod != "token" || cfg.CAFingerprint != f.h.Fingerprint() {
		t.Errorf("agent.yaml after the join: %+v", cfg)
	}
	if !dir.keystoreHolds(id.Leaf()) {
		t.Error("the keystore does not hold the certificate")
	}
}

func TestJoinRefusesBeforeSendingSecret(t *testing.T) {
	good := newFakeAuthority(t, fakeOptions{})
	// An impostor: a real CA and a valid server certificate, but not the
	// authority's SPIFFE ID (here, an agent's).
	notAuthority, _ := spiffeid.New("test", spiffeid.RoleAgent, "impostor")
	impostor := newFakeAuthority(t, fakeOptions{serverID: notAuthority.URL()})
	other := newFakeAuthority(t, fakeOptions{})

	wrongSecret, err := jointoken.Parse(good.token.ID + ".0123456789abcdef")
	if err != nil {
		t.Fatal(err)
	}
	if wrongSecret.Reveal() == good.token.Reveal() {
		t.Skip("the generated secret happens to be the wrong one")
	}
	tests := []struct {
		name string
		f    *fakeAuthority
		req  func(*fakeAuthority) JoinRequest
		want func(*testing.T, error)
	}{
		{
			name: "wrong secret",
			f:    good,
			req: func(f *fakeAuthority) JoinRequest {
				r := f.joinRequest("n1")
				r.Token = wrongSecret
				return r
			},
			want: func(t *testing.T, err error) {
				if !errors.Is(err, ErrTrustBundle) || codeOf(err) != codes.NotFound {
					t.Errorf("got %v (code %v), want ErrTrustBundle as NOT_FOUND", err, codeOf(err))
				}
				if strings.Contains(err.Error(), "0123456789abcdef") {
					t.Errorf("the error shows the secret: %v", err)
				}
			},
		},
		{
			name: "server without the authority SPIFFE ID",
			f:    impostor,
			req:  func(f *fakeAuthority) JoinRequest { return f.joinRequest("n1") },
			want: func(t *testing.T, err error) {
				if codeOf(err) != codes.Unavailable || !strings.Contains(err.Error(), "want spiffe://") {
					t.Errorf("got %v, want a refused handshake", err)
				}
			},
		},
		{
			name: "fingerprint mismatch",
			f:    good,
			req: func(f *fakeAuthority) JoinRequest {
				r := f.joinRequest("n1")
				r.CAFingerprint = other.h.Fingerprint()
				return r
			},
			want: func(t *testing.T, err error) {
				if !errors.Is(err, ErrFingerprint) {
					t.Errorf("got %v, want ErrFingerprint", err)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := Dir(filepath.Join(t.TempDir(), "agent"))
			_, ex0, _ := tt.f.calls()
			_, err := newTestAgent(t, dir).Join(t.Context(), tt.req(tt.f))
			var op *OpError
			if !errors.As(err, &op) || op.Op != "join" {
				t.Fatalf("got %v, want a join *OpError", err)
			}
			tt.want(t, err)
			if _, ex, _ := tt.f.calls(); ex != ex0 {
				t.Error("the token's secret was sent")
			}
			assertNoCertFiles(t, dir)
		})
	}

	// The same request with the right fingerprint is accepted.
	r := good.joinRequest("n1")
	r.CAFingerprint = strings.ToUpper(good.h.Fingerprint()[7:])
	r.CAFingerprint = "sha256:" + r.CAFingerprint
	if _, err := newTestAgent(t, Dir(t.TempDir())).Join(t.Context(), r); err != nil {
		t.Fatalf("join with the right fingerprint: %v", err)
	}
}

func TestJoinChecksTheIssuedCertificate(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	f.mu.Lock()
	f.wrongKey = true
	f.mu.Unlock()
	dir := Dir(t.TempDir())
	_, err := newTestAgent(t, dir).Join(t.Context(), f.joinRequest("n1"))
	if err == nil || !strings.Contains(err.Error(), "different key") {
		t.Fatalf("got %v, want a refusal of a certificate for another key", err)
	}
	assertNoCertFiles(t, dir)

	// The chain must end at the pinned root, and name this node.
	f.mu.Lock()
	f.wrongKey = false
	f.mu.Unlock()
	stranger := newFakeAuthority(t, fakeOptions{})
	key, csr := newKeyAndCSR(t)
	want, _ := spiffeid.New(f.aid, spiffeid.RoleAgent, "n1")
	roots := []*x509.Certificate{f.h.Root}
	stranger.mu.Lock()
	chain, err := stranger.issue("n1", csr)
	stranger.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := verifyIssued(chain, key, roots, want, time.Now()); err == nil || !strings.Contains(err.Error(), "pinned root") {
		t.Fatalf("a chain to another root: %v", err)
	}
	f.mu.Lock()
	chain, err = f.issue("n2", csr)
	f.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := verifyIssued(chain, key, roots, want, time.Now()); err == nil || !strings.Contains(err.Error(), "agent/n2") {
		t.Fatalf("a certificate for another node: %v", err)
	}
	if got, err := verifyIssued(chain, key, roots, spiffeid.ID{TrustDomain: f.aid, Role: spiffeid.RoleAgent, Name: "n2"}, time.Now()); err != nil || len(got) != 2 {
		t.Fatalf("the right certificate: %v, chain of %d (want the leaf and its intermediate, no root)", err, len(got))
	}
}

func newKeyAndCSR(t *testing.T) (crypto.Signer, []byte) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := csrFor(k)
	if err != nil {
		t.Fatal(err)
	}
	return k, csr
}

func TestJoinRefusalsKeepNoFilesAndOldIdentity(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	dir := Dir(t.TempDir())
	a := newTestAgent(t, dir)

	f.mu.Lock()
	f.exchangeErr = errinfo.Error(codes.FailedPrecondition, "join token has no uses left", "token_used_up")
	f.mu.Unlock()
	_, err := a.Join(t.Context(), f.joinRequest("n1"))
	if codeOf(err) != codes.FailedPrecondition || errinfo.Reason(err) != "token_used_up" {
		t.Fatalf("got %v, want FAILED_PRECONDITION token_used_up", err)
	}
	// The line agent join ends with names the way out (TestTokenRefusalHint).
	if want := "muster token create --node n1"; !strings.Contains(err.Error(), want) {
		t.Errorf("got %v, want it to name %q", err, want)
	}
	assertNoCertFiles(t, dir)

	f.mu.Lock()
	f.exchangeErr = nil
	f.mu.Unlock()
	if _, err := a.Join(t.Context(), f.joinRequest("n1")); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, dir)
	if _, err := a.Join(t.Context(), f.joinRequest("n1")); !errors.Is(err, ErrIdentityExists) {
		t.Fatalf("join over an identity: %v, want ErrIdentityExists", err)
	}
	// --force, refused: the old identity stays, byte for byte.
	f.mu.Lock()
	f.exchangeErr = status.Error(codes.PermissionDenied, "locked")
	f.mu.Unlock()
	r := f.joinRequest("n1")
	r.Force = true
	if _, err := a.Join(t.Context(), r); codeOf(err) != codes.PermissionDenied {
		t.Fatalf("forced join: %v, want PERMISSION_DENIED", err)
	}
	after := snapshot(t, dir)
	for path, data := range before {
		if after[path] != data {
			t.Errorf("%s changed after a failed forced join", path)
		}
	}
	// --force, accepted: a new identity replaces the old.
	f.mu.Lock()
	f.exchangeErr = nil
	f.mu.Unlock()
	if _, err := a.Join(t.Context(), r); err != nil {
		t.Fatalf("forced join: %v", err)
	}
	if snapshot(t, dir)[dir.CertFile()] == before[dir.CertFile()] {
		t.Error("a forced join left the old certificate")
	}
}

func assertNoCertFiles(t *testing.T, dir Dir) {
	t.Helper()
	for _, p := range append(dir.certFiles(), dir.StateFile()) {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s exists after a failed join", p)
		}
	}
	entries, _ := os.ReadDir(filepath.Join(string(dir), "certs"))
	for _, e := range entries {
		t.Errorf("certs/%s exists after a failed join", e.Name())
	}
}

// snapshot reads every file of the directory.
func snapshot(t *testing.T, dir Dir) map[string]string {
	t.Helper()
	out := map[string]string{}
	filepath.WalkDir(string(dir), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			b, _ := os.ReadFile(p)
			out[p] = string(b)
		}
		return nil
	})
	return out
}

// An agent.yaml the join cannot read is not replaced by an empty one (its
// workload_api and other settings lost): the join refuses, naming the file
// and the way out, before it sends anything, and changes nothing.
func TestJoinRefusesAnUnreadableConfig(t *testing.T) {
	for _, force := range []bool{false, true} {
		t.Run(fmt.Sprintf("force=%v", force), func(t *testing.T) {
			f := newFakeAuthority(t, fakeOptions{})
			dir := Dir(t.TempDir())
			if force {
				_, dir = joined(t, f)
			}
			const bad = "workload_api:\n  listen: [unix:///run/muster/workload.sock\n"
			if err := os.MkdirAll(string(dir), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dir.ConfigFile(), []byte(bad), 0o600); err != nil {
				t.Fatal(err)
			}
			newTestAgent(t, dir) // a first agent may create the lock file
			before := snapshot(t, dir)
			_, exchangesBefore, _ := f.calls()
			r := f.joinRequest("n1")
			r.Force = force
			_, err := newTestAgent(t, dir).Join(t.Context(), r)
			if err == nil || !strings.Contains(err.Error(), dir.ConfigFile()) || !strings.Contains(err.Error(), "join again") {
				t.Fatalf("join with a malformed agent.yaml: %v, want a refusal naming %s and the way out", err, dir.ConfigFile())
			}
			if _, exchanges, _ := f.calls(); exchanges != exchangesBefore {
				t.Errorf("the join sent the token (%d exchanges, %d before)", exchanges, exchangesBefore)
			}
			after := snapshot(t, dir)
			for p, b := range before {
				if after[p] != b {
					t.Errorf("%s changed", p)
				}
			}
			for p := range after {
				if _, ok := before[p]; !ok && filepath.Base(p) != "lock" {
					t.Errorf("%s written", p)
				}
			}
		})
	}
}
