package datadir

import (
	"bytes"
	"fmt"
	"os"
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

// A field a newer muster added to authority.json is refused as such, not
// as damage: "corrupt" sends the operator to a backup they do not need.
func TestReadInfoRefusesANewerField(t *testing.T) {
	d := Dir(t.TempDir())
	if err := d.WriteInfo(Info{FormatVersion: FormatVersion, AuthorityID: "a", TrustDomain: "td",
		CAFingerprint: "sha256:00", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(d.InfoFile())
	if err != nil {
		t.Fatal(err)
	}
	b = bytes.Replace(b, []byte("{"), []byte(`{"from_a_newer_muster": 1,`), 1)
	if err := os.WriteFile(d.InfoFile(), b, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = d.ReadInfo()
	if err == nil {
		t.Fatal("ReadInfo of an unknown field: no error")
	}
	for _, want := range []string{`has the field "from_a_newer_muster", which this binary does not know`, "a newer muster wrote it; run a muster of that version or later"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("ReadInfo: %v\nwant it to say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "corrupt") {
		t.Errorf("ReadInfo: %v calls a newer field damage", err)
	}
}
