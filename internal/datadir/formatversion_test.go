package datadir

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// A directory a newer muster wrote is refused naming the way out, as a
// store of a newer schema is: the operator meets it mid-rollback, and
// "newer than this binary knows" alone leaves them to guess what to run.
func TestReadInfoRefusesANewerLayout(t *testing.T) {
	d := Dir(t.TempDir())
	if err := d.WriteInfo(Info{FormatVersion: FormatVersion + 1, AuthorityID: "a", TrustDomain: "td",
		CAFingerprint: "sha256:00", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	_, err := d.ReadInfo()
	if err == nil {
		t.Fatal("ReadInfo of a newer layout: no error")
	}
	for _, want := range []string{
		fmt.Sprintf("has layout version %d, newer than this binary knows (%d)", FormatVersion+1, FormatVersion),
		fmt.Sprintf("run a muster that knows data directory layout %d or later (`muster version` shows", FormatVersion+1),
		"restore the directory from the copy taken before the upgrade (docs/install.md, \"Upgrades\")",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("ReadInfo: %v\nwant it to say %q", err, want)
		}
	}
}
