package cli

import (
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/identity"
)

// The way out of an authority whose certificate does not chain to the
// identity's roots is added for the CLI's own verification's typed
// refusal, however wrapped, and not for an error that only reads like it
// (a server's message, a proxy's), whose text anyone can write.
func TestUntrustedAuthorityHint(t *testing.T) {
	// An identity whose name cannot be read: the hint says NAME.
	a := &adminFlags{id: &identity.Identity{Chain: []*x509.Certificate{{}}}, idPath: "admin.pem", data: "/srv/my authority"}
	untrusted := &identity.UntrustedRootError{Err: errors.New("x509: certificate signed by unknown authority")}
	const hint = "does not chain to the roots in admin.pem"
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"the refusal", untrusted, true},
		{"the refusal wrapped", fmt.Errorf("status: %w", fmt.Errorf("connect: %w", untrusted)), true},
		{"a look-alike status", status.Error(codes.Unavailable, "connection error: identity: peer certificate does not chain to the pinned root: x509: certificate signed by unknown authority"), false},
		{"a look-alike error", errors.New(untrusted.Error()), false},
	} {
		got := a.untrustedAuthorityHint(c.err)
		if has := strings.Contains(got.Error(), hint); has != c.want {
			t.Errorf("%s: %v; want the hint %v", c.name, got, c.want)
		}
		if c.want && !strings.Contains(got.Error(), "--data '/srv/my authority'") {
			t.Errorf("%s: %v; want the data directory quoted", c.name, got)
		}
		if !errors.Is(got, c.err) && status.Code(got) != status.Code(c.err) {
			t.Errorf("%s: %v lost the error it adds to", c.name, got)
		}
	}
}

// TestUntrustedAuthorityHintNamesCustodyBinary: the break-glass admin add
// the hint names is muster-pkcs11 where the data directory's
// authority.json records a PKCS#11 token (the static muster refuses to
// open it), as the expiry warning's is. Before, it was muster either way.
func TestUntrustedAuthorityHintNamesCustodyBinary(t *testing.T) {
	token := datadir.Dir(t.TempDir())
	if err := token.WriteInfo(datadir.Info{FormatVersion: 1, AuthorityID: "a", TrustDomain: "td", CAFingerprint: "f",
		Custody: &datadir.Custody{URI: "pkcs11:token=muster", Module: "/usr/lib/softhsm/libsofthsm2.so"}}); err != nil {
		t.Fatal(err)
	}
	a := &adminFlags{id: &identity.Identity{Chain: []*x509.Certificate{{}}}, idPath: "admin.pem", data: string(token)}
	got := a.untrustedAuthorityHint(&identity.UntrustedRootError{Err: errors.New("x509: certificate signed by unknown authority")})
	if want := "is: muster-pkcs11 admin add NAME --offline --data " + string(token); !strings.Contains(got.Error(), want) {
		t.Errorf("%v\nwant %q", got, want)
	}
}
