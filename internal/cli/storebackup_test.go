package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/muster-dev/muster/internal/store/sqlite"
)

// TestWriteBackupLeavesNothingHalfDone: a backup that fails (the source
// is no database) leaves no file at --out and no temporary file beside
// it; one whose --out appeared meanwhile is refused without --force,
// leaving that file as it was, and replaces it with --force.
func TestWriteBackupLeavesNothingHalfDone(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	src := filepath.Join(t.TempDir(), "muster.db")
	st, err := sqlite.Open(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	garbage := filepath.Join(t.TempDir(), "garbage.db")
	if err := os.WriteFile(garbage, []byte(strings.Repeat("not a database ", 512)), 0o600); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name, src string
		existing  bool
		force     bool
		wantErr   string
	}{
		{"no database", garbage, false, false, "garbage.db"},
		{"out exists", src, true, false, "--force"},
		{"out exists, --force", src, true, true, ""},
		{"new", src, false, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			out := filepath.Join(dir, "backup.db")
			if tc.existing {
				if err := os.WriteFile(out, []byte("older"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			_, schema, err := writeBackup(ctx, tc.src, out, tc.force)
			entries, _ := os.ReadDir(dir)
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("writeBackup: %v, want an error naming %q", err, tc.wantErr)
				}
				want := []string(nil)
				if tc.existing {
					want = []string{"backup.db"}
					if b, _ := os.ReadFile(out); string(b) != "older" {
						t.Errorf("the existing file was changed: %q", b)
					}
				}
				if strings.Join(names, ",") != strings.Join(want, ",") {
					t.Errorf("files left: %q, want %q", names, want)
				}
				return
			}
			if err != nil {
				t.Fatalf("writeBackup: %v", err)
			}
			if schema == 0 || strings.Join(names, ",") != "backup.db" {
				t.Errorf("schema %d, files %q; want a schema and backup.db alone", schema, names)
			}
			if fi, err := os.Stat(out); err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("backup: %v, %v; want mode 0600", fi, err)
			}
		})
	}
}
