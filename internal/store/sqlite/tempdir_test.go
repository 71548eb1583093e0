package sqlite

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTempDir(t *testing.T) {
	ok := t.TempDir()
	file := filepath.Join(ok, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	gone := filepath.Join(ok, "gone")
	// readOnly stands for a read-only filesystem, which root's access(2)
	// sees too (EROFS) where it ignores a directory's mode.
	readOnly := filepath.Join(ok, "ro")
	if err := os.Mkdir(readOnly, 0o755); err != nil {
		t.Fatal(err)
	}
	writable := func(d string) bool { return d != readOnly && writableDir(d) }
	cases := []struct {
		name              string
		sqliteTmp, tmpdir string
		candidates        []string
		want              string // "" for an error
	}{
		{"SQLITE_TMPDIR first", ok, gone, []string{readOnly}, ok},
		{"TMPDIR next", gone, ok, []string{readOnly}, ok},
		{"a candidate", "", file, []string{gone, readOnly, ok}, ok},
		{"none writable", readOnly, gone, []string{file, readOnly}, ""},
		{"none at all", "", "", nil, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{"SQLITE_TMPDIR": tc.sqliteTmp, "TMPDIR": tc.tmpdir}
			got, err := tempDir(func(k string) string { return env[k] }, tc.candidates, writable)
			if tc.want != "" {
				if err != nil || got != tc.want {
					t.Fatalf("got %q, %v; want %q", got, err, tc.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "emptyDir mounted at /tmp") || !strings.Contains(err.Error(), "SQLITE_TMPDIR") {
				t.Fatalf("got %q, %v; want an error naming the fix", got, err)
			}
			if tc.tmpdir != "" && !strings.Contains(err.Error(), tc.tmpdir) {
				t.Errorf("the error does not name %s, which it looked at: %v", tc.tmpdir, err)
			}
		})
	}
	// SQLite's own list, in its order.
	if strings.Join(tempDirCandidates, " ") != "/var/tmp /usr/tmp /tmp ." {
		t.Errorf("candidates %v", tempDirCandidates)
	}
}
