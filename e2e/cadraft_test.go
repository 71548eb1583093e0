package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCADraftDiscardedAfterTTL: with ca.draft_ttl at 5s, a draft of muster
// ca rotate agent --root-key FILE whose certificate never comes back (the
// key in FILE is another authority's root, so the CLI stops between its
// two calls) has its key destroyed by the leader once the 5 s have
// passed, audited ca.discard naming the setting and its value; a rotation
// with the right key then drafts and prepares anew.
func TestCADraftDiscardedAfterTTL(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	rootKey := filepath.Join(t.TempDir(), "root.key")
	if err := os.Rename(filepath.Join(dir, "ca", "root.key"), rootKey); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "authority.yaml"), []byte("ca:\n  draft_ttl: 5s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	auth := startAuthority(t, dir)

	otherDir, _ := initDir(t)
	if line := mustFail(t, "ca", "rotate", "agent", "--root-key", filepath.Join(otherDir, "ca", "root.key"), "--data", dir); !strings.Contains(line, "is not this authority's root key") {
		t.Fatalf("ca rotate with another root key: %s", line)
	}
	drafted := time.Now()
	// Not yet: the draft is younger than ca.draft_ttl.
	if d := auditOf(t, dir, "ca.discard"); len(d) != 0 {
		t.Fatalf("a draft was discarded before ca.draft_ttl: %+v", d)
	}
	var discard []auditRec
	// Discarded after 5 s, within the leader's next CA clock tick (5 s)
	// and sweep (2.5 s under a 5 s ca.draft_ttl).
	if !pollFor(30*time.Second, func() bool { discard = auditOf(t, dir, "ca.discard"); return len(discard) > 0 }) {
		t.Fatalf("the abandoned draft was not discarded within 30s:\n%s", auth.Logs())
	}
	if took := time.Since(drafted); took < 5*time.Second {
		t.Errorf("the draft was discarded %v after it was made, before ca.draft_ttl (5s)", took)
	}
	d := discard[0]
	if len(discard) != 1 || !strings.HasPrefix(d.Target, "agent/") || d.Result != "ok" || d.Actor != "authority" ||
		!strings.Contains(d.Reason, "never came back within ca.draft_ttl (5s)") || !strings.Contains(d.Reason, "destroyed") {
		t.Fatalf("ca.discard records %+v; want one for the agent draft naming ca.draft_ttl (5s) and its key destroyed", discard)
	}
	if !strings.Contains(auth.Logs(), `"action":"ca.discard","role":"agent"`) {
		t.Errorf("the discard is not logged:\n%s", auth.Logs())
	}
	// The right key drafts again and prepares.
	prep := caRotate(t, dir, "agent", "--root-key", rootKey)
	if prep.Intermediate.State != "prepared" || "agent/"+prep.Intermediate.Serial == d.Target {
		t.Fatalf("ca rotate --root-key after the discard: %+v", prep)
	}
}
