package cli

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/spiffeid"
)

func TestExpiryWarning(t *testing.T) {
	now := time.Now()
	h, err := ca.Create("test", now)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := spiffeid.New("td", spiffeid.RoleAdmin, "alice")
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	op, err := datadir.IssueOperator(h.Issuer(ca.RoleAdmin), h.Root, id, key, 30*24*time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	notAfter := op.Leaf().NotAfter
	for _, tc := range []struct {
		name      string
		at        time.Time
		untrusted bool
		want      string // "" for no warning
	}{
		{"far", now, false, ""},
		{"just outside 7 days", notAfter.Add(-operatorWarnAhead - time.Minute), false, ""},
		{"within 7 days", notAfter.Add(-operatorWarnAhead + time.Minute), false, "in 6d23h; renew it with muster admin renew"},
		{"minutes left", notAfter.Add(-90 * time.Second), false, "in 1m30s; renew it with muster admin renew --identity alice.pem"},
		{"within 7 days, not accepted", notAfter.Add(-time.Hour), true, "in 1h0m0s; muster admin renew cannot renew it while the authority does not accept it (a root rotation in standby no longer trusts its root): get a new one where the authority's data directory is: muster admin add alice --offline --data DIR --out alice-new.pem"},
		{"far, not accepted", now, true, ""},
		{"expired", notAfter.Add(time.Second), false, "expired at " + notAfter.UTC().Format(time.RFC3339) + "; another operator issues a new one with muster admin add alice --out alice-new.pem, or, where the authority's data directory is, muster admin add alice --offline --data DIR --out alice-new.pem"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := expiryWarning("alice.pem", op, "alice", "", " --identity alice.pem", tc.untrusted, tc.at)
			if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) || tc.untrusted && strings.Contains(got, "renew it with") {
				t.Errorf("expiryWarning = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestRefusedIdentity: the expiry warning names admin add, not admin
// renew, after a call refused because the authority does not accept the
// identity (its certificate did not chain to the identity's roots, or
// the authority refused the identity's certificate); any other outcome
// keeps renew.
func TestRefusedIdentity(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"answered", nil, false},
		{"authority not trusted", status.Error(codes.Unavailable, "connection error"), false},
		{"untrusted root", fmt.Errorf("dial: %w", &identity.UntrustedRootError{Err: errors.New("x509: unknown authority")}), true},
		{"identity refused", status.Error(codes.Unauthenticated, "client certificate not issued by this authority: it is under a root this authority no longer trusts"), true},
		{"permission", status.Error(codes.PermissionDenied, "locked"), false},
	} {
		if got := refusedIdentity(tc.err); got != tc.want {
			t.Errorf("%s: refusedIdentity(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// TestExpiryWarningNamesCustodyBinary: the break-glass admin add is named
// with the binary that opens the data directory's keys: muster-pkcs11
// where authority.json records a PKCS#11 token (the static muster refuses
// to open it), muster where the keys are sealed; with no data directory
// known, muster and the case that needs muster-pkcs11.
func TestExpiryWarningNamesCustodyBinary(t *testing.T) {
	now := time.Now()
	h, err := ca.Create("test", now)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := spiffeid.New("td", spiffeid.RoleAdmin, "alice")
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	op, err := datadir.IssueOperator(h.Issuer(ca.RoleAdmin), h.Root, id, key, 30*24*time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	sealed, token := datadir.Dir(t.TempDir()), datadir.Dir(t.TempDir())
	if err := sealed.WriteInfo(datadir.Info{FormatVersion: 1, AuthorityID: "a", TrustDomain: "td", CAFingerprint: "f"}); err != nil {
		t.Fatal(err)
	}
	if err := token.WriteInfo(datadir.Info{FormatVersion: 1, AuthorityID: "a", TrustDomain: "td", CAFingerprint: "f", Custody: &datadir.Custody{URI: "pkcs11:token=muster", Module: "/usr/lib/softhsm/libsofthsm2.so"}}); err != nil {
		t.Fatal(err)
	}
	expired := op.Leaf().NotAfter.Add(time.Second)
	soon := op.Leaf().NotAfter.Add(-time.Hour)
	for _, tc := range []struct {
		name, data string
		at         time.Time
		untrusted  bool
		want, not  string
	}{
		{"expired, sealed", string(sealed), expired, false, ", muster admin add alice --offline --data " + string(sealed), "muster-pkcs11"},
		{"expired, token", string(token), expired, false, ", muster-pkcs11 admin add alice --offline --data " + string(token), " muster admin add alice --offline"},
		{"not accepted, sealed", string(sealed), soon, true, "is: muster admin add alice --offline --data " + string(sealed), "muster-pkcs11"},
		{"not accepted, token", string(token), soon, true, "is: muster-pkcs11 admin add alice --offline --data " + string(token), " muster admin add alice --offline"},
		{"expired, no directory", "", expired, false, "muster admin add alice --offline --data DIR --out alice-new.pem (muster-pkcs11 in place of muster where the authority's keys are in a PKCS#11 token", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := expiryWarning("alice.pem", op, "alice", tc.data, "", tc.untrusted, tc.at)
			if !strings.Contains(got, tc.want) || tc.not != "" && strings.Contains(got, tc.not) {
				t.Errorf("expiryWarning = %q\nwant %q, not %q", got, tc.want, tc.not)
			}
		})
	}
}
