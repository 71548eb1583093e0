package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestInitRelativeStoreIsAbsolute: through the binary, `muster init
// --store sqlite://REL` run in one directory records the file it made by
// its absolute path in authority.json, so the offline commands and the
// authority, run from any other directory (the unit's is /), open that
// file. Before, authority.json kept sqlite://REL, and a command run
// elsewhere opened (and made) REL under its own working directory.
func TestInitRelativeStoreIsAbsolute(t *testing.T) {
	t.Parallel()
	tmp := t.TempDir()
	initWD, otherWD := filepath.Join(tmp, "init-here"), filepath.Join(tmp, "elsewhere")
	for _, d := range []string{initWD, otherWD} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(tmp, "authority")
	if r := musterIn(t, initWD, nil, "init", "--data", dir, "--store", "sqlite://records.db", "-o", "json"); r.code != 0 {
		t.Fatalf("init --store sqlite://records.db: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	want := "sqlite://" + filepath.Join(initWD, "records.db")
	raw, err := os.ReadFile(filepath.Join(dir, "authority.json"))
	if err != nil {
		t.Fatal(err)
	}
	var info struct{ Store string }
	if err := json.Unmarshal(raw, &info); err != nil {
		t.Fatal(err)
	}
	if info.Store != want {
		t.Errorf("authority.json records the store %q, want %q (the file init made, by its absolute path)", info.Store, want)
	}

	r := musterIn(t, otherWD, nil, "audit", "list", "--offline", "--data", dir, "-o", "json")
	var recs []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &recs); r.code != 0 || err != nil || len(recs) == 0 {
		t.Errorf("audit list --offline from another directory: exit %d, %d records (%v), want init's\n%s%s", r.code, len(recs), err, r.stdout, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(otherWD, "records.db")); err == nil {
		t.Errorf("a command run in %s made a store under it", otherWD)
	}
}
