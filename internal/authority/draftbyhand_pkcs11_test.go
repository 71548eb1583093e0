//go:build pkcs11 && cgo

package authority

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/custody/softhsmtest"
	"github.com/muster-dev/muster/internal/store"
)

// TestDraftKeyLeftByACrashIsNamedWithItsCommand: a replica that stops
// between claiming an expired draft (its ca.discard record written with
// the draft's removal) and destroying its key leaves the key in the token
// with no row to name it; the ca.discard record (and a failed
// ca.destroy_key's) names the commands that delete it, with the module
// the store's key custody records, the token and the object label, and
// those commands, pasted (the PIN given as pkcs11-tool would prompt for
// it), delete the key from the token (SoftHSM2). Before, the record said
// "delete it by hand (docs/hsm.md)" and named no command.
func TestDraftKeyLeftByACrashIsNamedWithItsCommand(t *testing.T) {
	tok := softhsmtest.Start(t)
	tk, err := custody.OpenPKCS11(custody.PKCS11Config{URI: tok.URI, Module: tok.Module, PINFile: tok.PINFile})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tk.Close() })
	a := startReplicas(t, nil, 1, noCAClock)
	s := a.srvs[0]
	ctx := t.Context()
	if _, err := s.store.RecordKeyCustody(ctx, store.KeyCustody{URI: tok.URI, Module: tok.Module},
		s.caStepLink("ca.migrate_custody", "custody", tok.URI, "test").Build); err != nil {
		t.Fatal(err)
	}
	tokenCA := tk.For("muster-ca/")
	k, err := tokenCA.Create(ctx, keyName("agent", "1f"), custody.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tokenCA.Signer(ctx, keyName("agent", "1f"), k); err != nil {
		t.Fatalf("the drafted key does not open: %v", err)
	}

	said := s.deleteByHand(ctx, custody.Where(k.Ref))
	cmds := regexp.MustCompile("`(pkcs11-tool [^`]*)`").FindAllStringSubmatch(said, -1)
	if len(cmds) != 2 {
		t.Fatalf("%q names %d pkcs11-tool commands, want the private and the public key's", said, len(cmds))
	}
	for _, c := range cmds {
		if !strings.Contains(c[1], tok.Module) {
			t.Errorf("%q does not name the recorded module %s", c[1], tok.Module)
		}
		cmd := tok.Command("sh", "-c", c[1]+" --pin "+softhsmtest.PIN)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", c[1], err, out)
		}
	}
	_, err = tokenCA.Signer(ctx, keyName("agent", "1f"), k)
	if err == nil {
		t.Fatal("the key still opens after the commands the record names")
	}
	if errors.Is(err, custody.ErrNoToken) {
		t.Fatal(err)
	}
}
