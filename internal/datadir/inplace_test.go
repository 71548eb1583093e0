package datadir

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// An init into an existing empty directory whose last move fails (a
// racing init made authority.json) moves back what it moved and says
// nothing is left; where a move back fails too, the error names what is
// left with the rm that removes it, and once that is pasted the same
// init runs again. Before, the move back's failure was ignored: the keys
// stayed in the directory with nothing said, and the next init refused
// the directory as not empty.
func TestInPlaceInitMoveFailureLeavesNothingSilently(t *testing.T) {
	for _, backFails := range []bool{false, true} {
		target := filepath.Join(t.TempDir(), "my data")
		if err := os.Mkdir(target, 0o700); err != nil {
			t.Fatal(err)
		}
		stuck := ""
		renameNoReplace = func(from, to string) error {
			switch {
			case filepath.Base(to) == "authority.json":
				return syscall.EEXIST
			case backFails && filepath.Dir(from) == target && stuck == "":
				stuck = filepath.Base(from)
				return syscall.EIO
			}
			return os.Rename(from, to)
		}
		_, err := Init(context.Background(), InitOptions{Dir: Dir(target), Name: "test", Now: time.Now()})
		renameNoReplace = func(from, to string) error { return os.Rename(from, to) }
		if !errors.Is(err, syscall.EEXIST) || !strings.Contains(err.Error(), "cannot move the new data directory's authority.json into "+target+": file exists") {
			t.Fatalf("move back fails %v: init: %v, want the failed move named", backFails, err)
		}
		entries, rerr := os.ReadDir(target)
		if rerr != nil {
			t.Fatal(rerr)
		}
		if !backFails {
			if len(entries) != 0 || !strings.Contains(err.Error(), "left nothing behind: run it again") {
				t.Fatalf("init whose moves were all undone: %v, %d entries left, want nothing left and that said", err, len(entries))
			}
			continue
		}
		if len(entries) != 1 || entries[0].Name() != stuck {
			t.Fatalf("left in the directory: %v, want only %s", entries, stuck)
		}
		msg := err.Error()
		_, rm, ok := strings.Cut(msg, "(rm -rf -- ")
		if !ok || strings.Contains(msg, "left nothing behind") {
			t.Fatalf("init whose move back failed: %q, want what is left named with the rm that removes it", msg)
		}
		rm, _, _ = strings.Cut(rm, ")")
		if out, err := exec.Command("sh", "-c", "rm -rf -- "+rm).CombinedOutput(); err != nil {
			t.Fatalf("the rm named: %v: %s", err, out)
		}
		if _, err := Init(context.Background(), InitOptions{Dir: Dir(target), Name: "test", Now: time.Now()}); err != nil {
			t.Fatalf("init after the rm named: %v", err)
		}
	}
}
