package datadir

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/signer"
)

// A muster init on the embedded store that fails after it wrote the
// store (here at the first task signer) leaves nothing, in a new
// directory or an existing empty one: its error says so and that the
// same init runs again, which it then does. A refusal before it made
// anything (a bad name) says nothing of the kind.
func TestFailedEmbeddedInitSaysRunAgain(t *testing.T) {
	ctx := context.Background()
	failing := func(seal.StorageKey, *custody.Token) (signer.Custody, error) { return nil, errInjected }
	for _, inPlace := range []bool{false, true} {
		parent := t.TempDir()
		target := filepath.Join(parent, "a")
		if inPlace {
			if err := os.Mkdir(target, 0o700); err != nil {
				t.Fatal(err)
			}
		}
		_, err := Init(ctx, InitOptions{Dir: Dir(target), Name: "test", Now: time.Now(), SignerCustody: failing})
		if !errors.Is(err, errInjected) || !strings.Contains(err.Error(), "muster init left nothing behind: run it again") {
			t.Fatalf("in place %v: init failing at its signer: %v, want the failure and that nothing is left", inPlace, err)
		}
		var left []string
		filepath.WalkDir(parent, func(p string, _ os.DirEntry, _ error) error {
			if p != parent && (p != target || !inPlace) {
				left = append(left, p)
			}
			return nil
		})
		if len(left) > 0 {
			t.Errorf("in place %v: left after the failed init: %v", inPlace, left)
		}
		if _, err := Init(ctx, InitOptions{Dir: Dir(target), Name: "test", Now: time.Now()}); err != nil {
			t.Fatalf("in place %v: init again: %v", inPlace, err)
		}
	}
	_, err := Init(ctx, InitOptions{Dir: Dir(filepath.Join(t.TempDir(), "b")), Name: "bad name!", Now: time.Now()})
	if err == nil || strings.Contains(err.Error(), "left nothing behind") {
		t.Errorf("init with a bad name: %v, want a refusal that does not speak of what init left", err)
	}
}
