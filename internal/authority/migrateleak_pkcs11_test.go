//go:build pkcs11 && cgo

package authority

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/custody/softhsmtest"
	"github.com/muster-dev/muster/internal/store"
)

// insertFails refuses every InsertCACert as a store that went away
// would, after running first (nil: nothing).
type insertFails struct {
	store.Store
	first func()
}

func (s insertFails) InsertCACert(context.Context, store.CACert, func(store.AuditHead) (store.AuditRecord, error)) error {
	if s.first != nil {
		s.first()
	}
	return store.ErrUnavailable
}

// TestMigrateCustodyFailedWriteLeavesNoObject: ca migrate-custody makes a
// successor's key in the token, then the store refuses to record it. The
// key is destroyed, so nothing is left in the token that no row names;
// and when the token stops answering too (its directory moved away, as
// an HSM unplugged), the refusal names the two pkcs11-tool commands that
// delete that key's objects, which, pasted once the token is back (the
// PIN given as pkcs11-tool would prompt for it), leave no object of it.
// Before, the destruction's failure was dropped unchecked and the
// refusal named only the store's error: the object leaked, unnamed.
func TestMigrateCustodyFailedWriteLeavesNoObject(t *testing.T) {
	for _, tc := range []struct {
		name      string
		tokenAway bool
	}{
		{"the key is destroyed", false},
		{"the token away too: the key is named", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok := softhsmtest.Start(t)
			tk, err := custody.OpenPKCS11(custody.PKCS11Config{URI: tok.URI, Module: tok.Module, PINFile: tok.PINFile})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { tk.Close() })
			a := startReplicas(t, nil, 1, noCAClock)
			s := a.srvs[0]
			tokens := filepath.Join(filepath.Dir(tok.Conf), "tokens")
			entries, err := os.ReadDir(tokens)
			if err != nil || len(entries) != 1 {
				t.Fatalf("the token directory %s: %v, %d entries", tokens, err, len(entries))
			}
			in, away := filepath.Join(tokens, entries[0].Name()), filepath.Join(filepath.Dir(tok.Conf), "away")
			st := insertFails{Store: a.store}
			if tc.tokenAway {
				st.first = func() {
					if err := os.Rename(in, away); err != nil {
						t.Error(err)
					}
				}
			}
			_, err = MigrateCustody(t.Context(), CustodyMigration{
				Store: st, CA: a.h, StorageKey: a.sk, Token: tk, URI: tok.URI, Module: tok.Module,
				Audit: s.audit, AuthorityID: a.info.AuthorityID, Actor: "test", IntermediateTTL: time.Hour,
			})
			if !errors.Is(err, store.ErrUnavailable) {
				t.Fatalf("MigrateCustody = %v, want the store's refusal", err)
			}
			cmds := regexp.MustCompile("`(pkcs11-tool [^`]*)`").FindAllStringSubmatch(err.Error(), -1)
			if tc.tokenAway {
				if err := os.Rename(away, in); err != nil {
					t.Fatal(err)
				}
				if len(cmds) != 2 {
					t.Fatalf("MigrateCustody = %v\nnames %d pkcs11-tool commands, want the private and the public key's", err, len(cmds))
				}
				for _, c := range cmds {
					if !strings.Contains(c[1], "--module "+tok.Module+" ") {
						t.Errorf("%q does not name the token's module %s", c[1], tok.Module)
					}
					if out, err := tok.Command("sh", "-c", c[1]+" --pin "+softhsmtest.PIN).CombinedOutput(); err != nil {
						t.Fatalf("%s: %v\n%s", c[1], err, out)
					}
				}
			} else if len(cmds) != 0 {
				t.Errorf("MigrateCustody = %v\nnames commands for a key it destroyed", err)
			}
			out, err := tok.Command("pkcs11-tool", "--module", tok.Module, "--token-label", softhsmtest.Label, "--login", "--pin", softhsmtest.PIN,
				"--list-objects").CombinedOutput()
			if err != nil {
				t.Fatalf("pkcs11-tool --list-objects: %v\n%s", err, out)
			}
			if strings.Contains(string(out), "muster-") {
				t.Errorf("the token holds an object after the failed migration:\n%s", out)
			}
		})
	}
}
