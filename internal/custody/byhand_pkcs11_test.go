//go:build pkcs11 && cgo

package custody_test

import (
	"context"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/custody/softhsmtest"
)

// TestDeleteCommandsDeleteTheKeyPasted: the commands DeleteCommands
// prints for a key, run as printed in a shell against SoftHSM2 (the PIN
// given as pkcs11-tool would prompt for it), delete that key's private
// and public objects, and not those of another key made under the same
// name (its label), which still signs. The module is the one the token
// was opened with. Before, several hints named `pkcs11-tool
// --delete-object --label L` alone, which pkcs11-tool cannot run (no
// module, no login, no type) and which names no single object.
func TestDeleteCommandsDeleteTheKeyPasted(t *testing.T) {
	ctx := context.Background()
	tk, tok := openToken(t, 0)
	c := tk.For("muster-ca/")
	gone, err := c.Create(ctx, "agent/1f", custody.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	kept, s := createSigner(ctx, t, c, "agent/1f", custody.ECDSAP256)
	if got := custody.ModuleOf(c); got != tok.Module {
		t.Fatalf("ModuleOf = %q, want %q", got, tok.Module)
	}
	cmds := custody.DeleteCommands(custody.ModuleOf(c), gone.Ref)
	if len(cmds) != 2 {
		t.Fatalf("DeleteCommands = %q, want the private and the public key's", cmds)
	}
	for _, cmd := range cmds {
		if out, err := tok.Command("sh", "-c", cmd+" --pin "+softhsmtest.PIN).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", cmd, err, out)
		}
	}
	if _, err := c.Signer(ctx, "agent/1f", gone); !errors.Is(err, custody.ErrKeyMissing) {
		t.Fatalf("the deleted key opens: %v, want ErrKeyMissing", err)
	}
	u, err := custody.ParsePKCS11URI(string(gone.Ref))
	if err != nil {
		t.Fatal(err)
	}
	out, err := tok.Command("pkcs11-tool", "--module", tok.Module, "--token-label", softhsmtest.Label, "--login", "--pin", softhsmtest.PIN,
		"--list-objects").CombinedOutput()
	if err != nil {
		t.Fatalf("pkcs11-tool --list-objects: %v\n%s", err, out)
	}
	if id := hex.EncodeToString(u.ID); strings.Contains(string(out), id) {
		t.Errorf("an object with the deleted key's ID %s is left:\n%s", id, out)
	}
	verify(t, kept.Public, []byte("the other key"), s)

	// The listing pastes too, and shows the key left with its ID.
	list := custody.ListCommand(custody.ModuleOf(c), tok.URI)
	out, err = tok.Command("sh", "-c", list+" --pin "+softhsmtest.PIN).CombinedOutput()
	ku, _ := custody.ParsePKCS11URI(string(kept.Ref))
	if err != nil || !strings.Contains(string(out), "muster-ca/agent/1f") || !strings.Contains(string(out), hex.EncodeToString(ku.ID)) {
		t.Errorf("%s: %v\n%s", list, err, out)
	}
}
