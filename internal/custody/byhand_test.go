package custody_test

import (
	"strings"
	"testing"

	"github.com/muster-dev/muster/internal/custody"
)

// TestDeleteByHandSays: the way out names both commands, in full, with
// the module (MODULE, explained, when none is known; the URI's
// module-path before that), the token and label quoted for a shell, and
// the CKA_ID in hex; a sealed key has nothing to delete.
func TestDeleteByHandSays(t *testing.T) {
	ref := []byte(custody.PKCS11URI{Token: "my hsm", Object: "muster-signer/v2-ab", ID: []byte{0x0a, 0xff}, Type: "private"}.String())
	for _, tc := range []struct {
		name, module string
		ref          []byte
		want         []string
	}{
		{"module known", "/usr/lib/softhsm/libsofthsm2.so", ref, []string{
			"delete it by hand: `pkcs11-tool --module /usr/lib/softhsm/libsofthsm2.so --token-label 'my hsm' --login --delete-object --label muster-signer/v2-ab --id 0aff --type privkey` and " +
				"`pkcs11-tool --module /usr/lib/softhsm/libsofthsm2.so --token-label 'my hsm' --login --delete-object --label muster-signer/v2-ab --id 0aff --type pubkey` (docs/hsm.md)"}},
		{"module unknown", "", ref, []string{"--module MODULE --token-label", "(MODULE: the token's PKCS#11 library, e.g. /usr/lib/softhsm/libsofthsm2.so)"}},
		{"module in the URI", "", []byte(string(ref) + "?module-path=/opt/hsm/lib.so"), []string{"--module /opt/hsm/lib.so --token-label"}},
		{"sealed", "/m.so", []byte("sealed bytes"), []string{"nothing is left to delete"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := custody.DeleteByHand(tc.module, tc.ref)
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("DeleteByHand = %q\nwant it to contain %q", got, w)
				}
			}
			if tc.module != "" && strings.Contains(got, "MODULE") {
				t.Errorf("DeleteByHand = %q names MODULE though the module is known", got)
			}
		})
	}
}

// TestListCommand: the listing names the module and the token's label.
func TestListCommand(t *testing.T) {
	got := custody.ListCommand("/usr/lib/softhsm/libsofthsm2.so", "pkcs11:token=my%20hsm")
	if want := "pkcs11-tool --module /usr/lib/softhsm/libsofthsm2.so --token-label 'my hsm' --login --list-objects --type privkey"; got != want {
		t.Errorf("ListCommand = %q, want %q", got, want)
	}
}
