package agent

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/errinfo"
)

// A bound-keypair refusal that ends agent run (or that it retries) names
// the way out, and keeps the code, the reason word and its details.
func TestBoundRefusalHint(t *testing.T) {
	st := &State{NodeID: "br1", BoundKeypair: "br1", JoinState: signedJoinState(t, 3, "relaxed")}
	for _, c := range []struct {
		code   codes.Code
		reason string
		want   string
	}{
		{codes.FailedPrecondition, "recovery_exhausted", "raise spec.bound_keypair.recovery.limit"},
		{codes.PermissionDenied, "join_state_mismatch", "muster audit list --action 'agent.*'"},
		// The holder left behind by a stale join state is told that
		// deleting the lock only lets the other back, and how to keep it.
		{codes.PermissionDenied, "join_state_mismatch", "muster lock delete ID only lets the other back in"},
		{codes.PermissionDenied, "join_state_mismatch", "muster token delete br1, muster bot add br1 --recovery-limit 3 --recovery-mode relaxed, and here muster agent join --force --data /var/lib/muster-agent --bound-keypair br1 --registration-secret-file F"},
		{codes.PermissionDenied, "locked", "muster lock list"},
		{codes.PermissionDenied, "copy_detected", "muster lock list"},
		{codes.FailedPrecondition, "registration_closed", "muster token delete br1 and muster bot add br1 --recovery-limit 3 --recovery-mode relaxed for a new secret"},
		// The token deleted: a new one, and the join over this identity.
		{codes.NotFound, "unknown bound-keypair token, or not for this node", "muster bot add br1 --recovery-limit 3 --recovery-mode relaxed for a new registration secret, then here muster agent join --force --data /var/lib/muster-agent --bound-keypair br1 --registration-secret-file F"},
		// Another key than the token's (a directory restored from before a
		// rotation): where to compare the two, and how to come back.
		{codes.Unauthenticated, "challenge_failed", "compare muster agent status --data /var/lib/muster-agent (key SHA256:…) with muster token get br1"},
		{codes.Unauthenticated, "challenge_failed", "muster agent join --force --data /var/lib/muster-agent --bound-keypair br1 --registration-secret-file F"},
		{codes.Unauthenticated, "challenge_failed", "muster token delete br1, muster bot add br1 --recovery-limit 3 --recovery-mode relaxed, and here"},
	} {
		word := c.reason
		if c.code == codes.NotFound {
			word = "not_found"
		}
		err := boundRefusalHint(errinfo.Error(c.code, c.reason, word), st, "/var/lib/muster-agent")
		s, _ := status.FromError(err)
		if s.Code() != c.code || errinfo.Reason(err) != word || !strings.HasPrefix(s.Message(), c.reason+"; ") || !strings.Contains(s.Message(), c.want) {
			t.Errorf("%s: got %v (reason %q), want the reason kept and %q", c.reason, err, errinfo.Reason(err), c.want)
		}
		if c.reason == "recovery_exhausted" && !retryableBound(err) {
			t.Error("recovery_exhausted with its hint is no longer retried")
		}
	}
	other := errinfo.Error(codes.DeadlineExceeded, "the challenge was not answered in time", "deadline_exceeded")
	if got := boundRefusalHint(other, st, "/var/lib/muster-agent"); got != other {
		t.Errorf("deadline_exceeded changed: %v", got)
	}
}

// A PSK that no longer matches (rotated away while the machine was
// offline) names where the active one is, keeping code and reason word.
func TestPSKRefusalHint(t *testing.T) {
	for reason, msg := range map[string]string{"psk_mismatch": "bootstrap PSK does not match", "psk_missing": "bootstrap PSK is missing"} {
		err := pskRefusalHint(errinfo.Error(codes.PermissionDenied, msg, reason), "web-01")
		s, _ := status.FromError(err)
		if s.Code() != codes.PermissionDenied || errinfo.Reason(err) != reason || !strings.HasPrefix(s.Message(), msg+"; ") || !strings.Contains(s.Message(), "muster psk show") {
			t.Errorf("%s: got %v", reason, err)
		}
	}
	// A lock on the node: it once stayed a bare "locked".
	locked := pskRefusalHint(errinfo.Error(codes.PermissionDenied, "locked", "locked"), "web-01")
	if s, _ := status.FromError(locked); s.Code() != codes.PermissionDenied || errinfo.Reason(locked) != "locked" ||
		!strings.HasPrefix(s.Message(), "locked; ") || !strings.Contains(s.Message(), "muster lock list") || !strings.Contains(s.Message(), "muster lock delete LOCK-ID") {
		t.Errorf("locked: got %v, want the way out named", locked)
	}
	taken := pskRefusalHint(errinfo.Error(codes.AlreadyExists, "node ID already exists", "node_taken"), "web-01")
	if s, _ := status.FromError(taken); s.Code() != codes.AlreadyExists || errinfo.Reason(taken) != "node_taken" ||
		!strings.Contains(s.Message(), "muster token create --node web-01") || !strings.Contains(s.Message(), "muster agents delete web-01") {
		t.Errorf("node_taken: got %v, want the way out named", taken)
	}
	other := errinfo.Error(codes.PermissionDenied, "referral ticket was already used", "ticket_used")
	if got := pskRefusalHint(other, "web-01"); got != other {
		t.Errorf("ticket_used changed: %v", got)
	}
}

// A join token's refusal at agent join names what the operator runs:
// each reason of DESIGN.md's join table that an operator acts on, with
// the token's ID (public) and the node, never the secret; the code and
// the reason word stay.
func TestTokenRefusalHint(t *testing.T) {
	for _, c := range []struct {
		code   codes.Code
		msg    string
		reason string
		want   []string
	}{
		{codes.FailedPrecondition, "join token expired", "token_expired", []string{"muster token create --node web-01", "muster token get abcdef"}},
		{codes.FailedPrecondition, "join token has no uses left", "token_used_up", []string{"muster token create --node web-01"}},
		{codes.FailedPrecondition, "join token has no uses left or expired", "token_spent", []string{"muster token create --node web-01"}},
		{codes.PermissionDenied, "join token is bound to another node", "token_bound_elsewhere", []string{"muster token get abcdef", "muster token create --node web-01"}},
		{codes.AlreadyExists, "node ID already exists", "node_taken", []string{"muster token create --node web-01", "muster agents delete web-01"}},
		// It once stayed a bare "locked".
		{codes.PermissionDenied, "locked", "locked", []string{"node web-01", "muster lock list", "muster lock delete LOCK-ID"}},
	} {
		err := tokenRefusalHint(errinfo.Error(c.code, c.msg, c.reason), "abcdef", "web-01")
		s, _ := status.FromError(err)
		if s.Code() != c.code || errinfo.Reason(err) != c.reason || !strings.HasPrefix(s.Message(), c.msg+"; ") {
			t.Errorf("%s: got %v (reason %q), want the code, reason and message kept", c.reason, err, errinfo.Reason(err))
		}
		for _, w := range c.want {
			if !strings.Contains(s.Message(), w) {
				t.Errorf("%s: got %q, want it to name %q", c.reason, s.Message(), w)
			}
		}
	}
	for _, other := range []error{
		errinfo.Error(codes.NotFound, "unknown join token or wrong secret", "not_found"),
	} {
		if got := tokenRefusalHint(other, "abcdef", "web-01"); got != other {
			t.Errorf("%v changed: %v", other, got)
		}
	}
}

// A discovery that cannot be reached, or that refuses, fails the join as
// discovery's (DiscoveryError, which the CLI prints naming discovery), not
// as an unreachable authority.
func TestLocateFailureNamesDiscovery(t *testing.T) {
	a := New(Options{Dir: Dir(t.TempDir()), Timeout: 5 * time.Second})
	_, _, err := a.locate(t.Context(), JoinRequest{Discovery: "127.0.0.1:1", AuthorityID: "prod-a3f2e1", Node: "web-01"})
	var de *DiscoveryError
	if !errors.As(err, &de) || de.Addr != "127.0.0.1:1" || status.Code(err) != codes.Unavailable {
		t.Fatalf("got %v, want a DiscoveryError for 127.0.0.1:1 carrying UNAVAILABLE", err)
	}
}

// A bound-keypair agent whose certificate expired, asked for a JWT-SVID
// before its recovery is done, says that agent run recovers it, not the
// token join of a token agent (whose command would take a token it does
// not need and drop its bound key's standing).
func TestExpiredBoundAgentNamesItsRecovery(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	_, dir := boundJoined(t, f)
	st, err := dir.ReadState()
	if err != nil {
		t.Fatal(err)
	}
	later := New(Options{Dir: dir, Now: func() time.Time { return st.NotAfter.Add(time.Second) }})
	_, _, err = later.JWTSVID(t.Context(), []string{"aud"})
	var exp *ExpiredError
	if !errors.As(err, &exp) || !strings.Contains(err.Error(), "muster agent run recovers it with the bound key") || strings.Contains(err.Error(), "token create") {
		t.Errorf("got %v, want the bound key's recovery named", err)
	}
}

// signedJoinState is a join state document of token br1 with these
// recovery settings, as an authority signs it.
func signedJoinState(t *testing.T, limit int64, mode string) string {
	t.Helper()
	k, err := boundkeypair.NewSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := k.Sign(boundkeypair.JoinState{Issuer: "test-abcdef", Token: "br1", NodeID: "br1", IssuedAt: time.Now(),
		InstanceID: "i1", RecoveryLimit: limit, RecoveryMode: mode})
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

// The way out of a deleted token names the bot add flags of its settings
// as a command to paste: from the agent's join state, and client,server
// when its certificate serves TLS; plain bot add for the defaults.
func TestBotAddAgainFlags(t *testing.T) {
	dir := Dir(t.TempDir())
	if err := os.MkdirAll(filepath.Join(string(dir), "certs"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name       string
		st         *State
		serverAuth bool
		want       string
	}{
		{"defaults", &State{BoundKeypair: "br1", JoinState: signedJoinState(t, 1, "standard")}, false, "muster bot add br1"},
		{"limit and mode", &State{BoundKeypair: "br1", JoinState: signedJoinState(t, 3, "insecure")}, false, "muster bot add br1 --recovery-limit 3 --recovery-mode insecure"},
		{"client,server", &State{BoundKeypair: "br1", JoinState: signedJoinState(t, 2, "standard")}, true, "muster bot add br1 --recovery-limit 2 --svid-usage client,server"},
		{"no join state", &State{BoundKeypair: "br1"}, false, "muster bot add br1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			writeTestCert(t, dir.CertFile(), c.serverAuth)
			if got := botAddAgain(c.st, dir); got != c.want {
				t.Errorf("got %q, want %q", got, c.want)
			}
		})
	}
}

func writeTestCert(t *testing.T, path string, serverAuth bool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	usage := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if serverAuth {
		usage = append(usage, x509.ExtKeyUsageServerAuth)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: usage}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
