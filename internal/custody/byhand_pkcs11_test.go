//go:build pkcs11 && cgo

package custody_test

import (
	"context"
	"encoding/hex"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

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

// destroyFails is a token custody whose Destroy fails, as a token that
// stops answering would.
type destroyFails struct{ *custody.PKCS11 }

func (destroyFails) Destroy(context.Context, string, custody.Key) error {
	return errors.New("token not present")
}

// TestSelfTestNamesTheKeyItCannotDestroy: a self-test (ca migrate-custody
// runs one before it writes anything) whose test key cannot be destroyed
// names the commands that delete it, and they, pasted, do. Before, it
// said only that destroying the test key failed, leaving an object
// nothing names.
func TestSelfTestNamesTheKeyItCannotDestroy(t *testing.T) {
	tk, tok := openToken(t, 0)
	err := custody.SelfTest(context.Background(), destroyFails{tk.For("muster-")})
	if err == nil {
		t.Fatal("SelfTest succeeded with a custody that cannot destroy")
	}
	cmds := regexp.MustCompile("`(pkcs11-tool [^`]*)`").FindAllStringSubmatch(err.Error(), -1)
	if len(cmds) != 2 {
		t.Fatalf("SelfTest = %v\nnames %d pkcs11-tool commands, want the private and the public key's", err, len(cmds))
	}
	for _, c := range cmds {
		if out, err := tok.Command("sh", "-c", c[1]+" --pin "+softhsmtest.PIN).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", c[1], err, out)
		}
	}
	out, err := tok.Command("pkcs11-tool", "--module", tok.Module, "--token-label", softhsmtest.Label, "--login", "--pin", softhsmtest.PIN,
		"--list-objects").CombinedOutput()
	if err != nil || strings.Contains(string(out), "muster-selftest/") {
		t.Errorf("after the commands (%v), the token holds:\n%s", err, out)
	}
}

// TestSelfTestOfAHungTokenNamesTheModuleAndTheKey: a self-test against
// SoftHSM2 whose destruction of the test key does not answer fails with
// ErrHung once its deadline passes, naming the module the token was
// opened with in the command that shows whether it answers, and the
// commands that delete the key it left, which, pasted, do; one whose
// making of the key does not answer names the listing that finds it.
// Before, the destruction had no deadline and the self-test (and ca
// migrate-custody) waited for ever.
func TestSelfTestOfAHungTokenNamesTheModuleAndTheKey(t *testing.T) {
	defer custody.SetSelfTestCallTimeout(2 * time.Second)()
	tk, tok := openToken(t, 0)
	selfTest := func(stage string) error {
		t.Helper()
		release := make(chan struct{})
		t.Cleanup(func() { close(release) })
		done := make(chan error, 1)
		go func() { done <- custody.SelfTest(context.Background(), hangs{tk.For("muster-"), stage, release}) }()
		select {
		case err := <-done:
			if !errors.Is(err, custody.ErrHung) || !strings.Contains(err.Error(), "`pkcs11-tool --module "+tok.Module+" --list-token-slots`") {
				t.Fatalf("SelfTest hung in %s = %v, want ErrHung naming the module", stage, err)
			}
			return err
		case <-time.After(2 * time.Minute):
			t.Fatalf("SelfTest still waits for a token that hangs in %s", stage)
		}
		return nil
	}

	err := selfTest("destroy")
	cmds := regexp.MustCompile("`(pkcs11-tool [^`]*--delete-object[^`]*)`").FindAllStringSubmatch(err.Error(), -1)
	if len(cmds) != 2 {
		t.Fatalf("SelfTest = %v\nnames %d delete commands, want the private and the public key's", err, len(cmds))
	}
	for _, c := range cmds {
		if out, err := tok.Command("sh", "-c", c[1]+" --pin "+softhsmtest.PIN).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", c[1], err, out)
		}
	}
	out, err := tok.Command("pkcs11-tool", "--module", tok.Module, "--token-label", softhsmtest.Label, "--login", "--pin", softhsmtest.PIN,
		"--list-objects").CombinedOutput()
	if err != nil || strings.Contains(string(out), "muster-selftest/") {
		t.Fatalf("after the commands (%v), the token holds:\n%s", err, out)
	}

	err = selfTest("create")
	list := regexp.MustCompile("`(pkcs11-tool [^`]*--list-objects[^`]*)`").FindStringSubmatch(err.Error())
	if list == nil || !strings.Contains(err.Error(), "selftest/ecdsa-p256-") {
		t.Fatalf("SelfTest hung making the key = %v\nnames no listing of the key it may leave", err)
	}
	out, lerr := tok.Command("sh", "-c", list[1]+" --pin "+softhsmtest.PIN).CombinedOutput()
	if lerr != nil || !strings.Contains(string(out), "muster-selftest/ecdsa-p256-") {
		t.Fatalf("%s: %v\n%s", list[1], lerr, out)
	}
}
