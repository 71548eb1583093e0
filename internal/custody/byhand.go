package custody

import (
	"encoding/hex"
	"strings"

	"github.com/muster-dev/muster/internal/shellword"
)

// UnknownModule stands for the token's PKCS#11 library in a command
// printed where no module is known (no token open, none recorded).
const UnknownModule = "MODULE"

// DeleteCommands are the pkcs11-tool commands that delete by hand the
// private and the public key object of the token key ref (a reference
// Create returned, or Where of one): the module, the token's label,
// --login (pkcs11-tool asks for the user PIN), the object's class, label
// and CKA_ID, so that each, pasted, deletes that key's object and no
// other (two keys may share a label: a step tried again under the same
// name). module "" is written UnknownModule. A sealed key, or a reference
// that names no object, has none: nothing of it is outside the store.
func DeleteCommands(module string, ref []byte) []string {
	if !IsPKCS11Ref(ref) {
		return nil
	}
	u, err := ParsePKCS11URI(string(ref))
	if err != nil || u.Object == "" || len(u.ID) == 0 {
		return nil
	}
	if module == "" {
		module = firstOf(u.ModulePath, UnknownModule)
	}
	base := "pkcs11-tool --module " + shellword.Quote(module) + " --token-label " + shellword.Quote(u.Token) +
		" --login --delete-object --label " + shellword.Quote(u.Object) + " --id " + hex.EncodeToString(u.ID)
	return []string{base + " --type privkey", base + " --type pubkey"}
}

// ListCommand is the pkcs11-tool command that lists the private key
// objects of the token tokenURI names (with their labels and CKA_IDs,
// what DeleteCommands needs), for objects no reference names any more.
// module "" is written UnknownModule.
func ListCommand(module, tokenURI string) string {
	u, err := ParsePKCS11URI(tokenURI)
	if err != nil {
		return ""
	}
	if module == "" {
		module = firstOf(u.ModulePath, UnknownModule)
	}
	return "pkcs11-tool --module " + shellword.Quote(module) + " --token-label " + shellword.Quote(u.Token) + " --login --list-objects --type privkey"
}

// DeleteByHand is the way out that names ref's DeleteCommands, for a
// refusal or record that leaves a key in the token: "delete it by hand:
// `…` and `…`"; for a sealed key, that nothing is left to delete.
func DeleteByHand(module string, ref []byte) string {
	cmds := DeleteCommands(module, ref)
	if cmds == nil {
		return "nothing is left to delete: a sealed key is gone with its reference"
	}
	s := "delete it by hand: `" + strings.Join(cmds, "` and `") + "`"
	if strings.Contains(cmds[0], "--module "+UnknownModule+" ") {
		s += " (" + UnknownModule + ": the token's PKCS#11 library, e.g. /usr/lib/softhsm/libsofthsm2.so)"
	}
	return s + " (docs/hsm.md)"
}

// ModuleOf is the PKCS#11 library of the token c opens keys in (a
// custody, or what wraps one), "" when it opens none or cannot say.
func ModuleOf(c any) string {
	if m, ok := c.(interface{ Module() string }); ok {
		return m.Module()
	}
	return ""
}

// Module is the library of the token b opens its token keys in, "" when
// it has none.
func (b ByRef) Module() string { return ModuleOf(b.Token) }

func firstOf(v ...string) string {
	for _, s := range v {
		if s != "" {
			return s
		}
	}
	return ""
}
