package cli

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/listener"
	"github.com/muster-dev/muster/internal/store/sqlite"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden with the current output")

// TestGoldenText compares the text output of commands with
// testdata/NAME.golden; go test ./internal/cli -run Golden -update
// rewrites them after an intended change.
func TestGoldenText(t *testing.T) {
	defer func(v, c, d string) { Version, Commit, BuildDate = v, c, d }(Version, Commit, BuildDate)
	Version, Commit, BuildDate = "v1.2.3", "0123abcd", "2026-11-24T12:00:00Z"
	// Values that differ between machines are replaced before comparing.
	dir := filepath.Join(t.TempDir(), "d")
	if code, _, stderr := runCLI(t, "init", "--data", dir, "--name", "golden"); code != 0 {
		t.Fatalf("init: %s", stderr)
	}
	id, td := authorityIdentity(t, dir)
	normalize := strings.NewReplacer(runtime.Version(), "GOVERSION", runtime.GOOS+"/"+runtime.GOARCH, "PLATFORM",
		dir, "DIR", id, "AUTHORITY_ID", td, "TRUST_DOMAIN",
		fmt.Sprintf(" %d (api and bootstrap listeners together)", listener.DefaultMaxConns()), " MAX_CONNECTIONS (api and bootstrap listeners together)",
		"open_file_limit:       "+fileLimit(t)+",", "open_file_limit:       OPEN_FILE_LIMIT,",
		// The next migration must not rewrite the goldens.
		fmt.Sprintf("store %d,", sqlite.LatestSchemaVersion()), "store SCHEMA,",
		fmt.Sprintf("store_schema: %d\n", sqlite.LatestSchemaVersion()), "store_schema: SCHEMA\n")
	tests := []struct {
		name string
		args []string
	}{
		{"version", []string{"version"}},
		{"version-yaml", []string{"version", "-o", "yaml"}},
		{"check-config", []string{"authority", "--check-config", "--data", dir, "--store", "postgres://muster:pw@db.internal/muster"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, tt.args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			checkGolden(t, tt.name, "muster "+strings.Join(tt.args, " "), normalize.Replace(stdout))
		})
	}
}

// checkGolden compares got, the output of what, with testdata/NAME.golden,
// first rewriting the file with -update.
func checkGolden(t *testing.T, name, what, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from %s:\n--- got\n%s\n--- want\n%s", what, path, got, want)
	}
}

func authorityIdentity(t *testing.T, dir string) (id, trustDomain string) {
	t.Helper()
	info, err := datadir.Dir(dir).ReadInfo()
	if err != nil {
		t.Fatal(err)
	}
	return info.AuthorityID, info.TrustDomain
}
