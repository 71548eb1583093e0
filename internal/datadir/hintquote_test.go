package datadir

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The way out of a directory with no authority names it so that it
// pastes as one word, a space or a quote in it included: pasted into sh,
// the command's --data is the directory.
func TestReadInfoHintQuotesTheDirectory(t *testing.T) {
	for _, name := range []string{"my authority", "it's"} {
		// One missing, one there but never initialised.
		empty := filepath.Join(t.TempDir(), name)
		if err := os.Mkdir(empty, 0o700); err != nil {
			t.Fatal(err)
		}
		for _, d := range []Dir{Dir(filepath.Join(t.TempDir(), name)), Dir(empty)} {
			_, err := d.ReadInfo()
			if err == nil {
				t.Fatalf("ReadInfo of %s: no error", d)
			}
			_, cmd, ok := strings.Cut(err.Error(), "muster init ")
			if !ok {
				t.Fatalf("ReadInfo of %s: %v, want a muster init to run", d, err)
			}
			cmd = strings.TrimSuffix(cmd, ")")
			// set -- puts the words as the shell reads them in $@.
			out, serr := exec.Command("sh", "-c", `set -- `+cmd+`; printf '%s' "$2"`).Output()
			if serr != nil || string(out) != string(d) {
				t.Errorf("ReadInfo of %q: %q pasted gives --data %q (%v)", d, cmd, out, serr)
			}
		}
	}
}
