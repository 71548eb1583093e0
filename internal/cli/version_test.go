package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/store/sqlite"
)

func TestVersion(t *testing.T) {
	defer func(v, c, d string) { Version, Commit, BuildDate = v, c, d }(Version, Commit, BuildDate)
	Version, Commit, BuildDate = "v1.2.3", "0123abcd", "2026-11-24T12:00:00Z"

	code, stdout, stderr := runCLI(t, "version")
	want := "muster v1.2.3\nCommit:     0123abcd\nBuilt:      2026-11-24T12:00:00Z\nGo version: " + runtime.Version() +
		"\nPlatform:   " + runtime.GOOS + "/" + runtime.GOARCH +
		fmt.Sprintf("\nSchema:     store %d, data directory %d\n", sqlite.LatestSchemaVersion(), datadir.FormatVersion)
	if code != 0 || stdout != want {
		t.Errorf("version = %d %q (stderr %q), want\n%s", code, stdout, stderr, want)
	}

	wantInfo := buildInfo{Version: "v1.2.3", Commit: "0123abcd", BuildDate: "2026-11-24T12:00:00Z",
		GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH,
		StoreSchema: sqlite.LatestSchemaVersion(), DataFormat: datadir.FormatVersion}
	for _, format := range []string{"json", "yaml"} {
		code, stdout, stderr = runCLI(t, "version", "-o", format)
		var got buildInfo
		var err error
		if format == "json" {
			err = json.Unmarshal([]byte(stdout), &got)
		} else {
			err = yaml.Unmarshal([]byte(stdout), &got)
		}
		if code != 0 || err != nil || got != wantInfo {
			t.Errorf("version -o %s = %d %q (%v, stderr %q), want %+v", format, code, stdout, err, stderr, wantInfo)
		}
	}
	if code, _, stderr := runCLI(t, "version", "-o", "xml"); code == 0 || !strings.Contains(stderr, "use text, json or yaml") {
		t.Errorf("version -o xml = %d %q, want a refusal naming the formats", code, stderr)
	}
}

// TestVersionFallback: without ldflags the version still names the Go
// toolchain, and never prints an empty commit.
func TestVersionFallback(t *testing.T) {
	defer func(v, c, d string) { Version, Commit, BuildDate = v, c, d }(Version, Commit, BuildDate)
	Version, Commit, BuildDate = "dev", "", ""
	b := currentBuild()
	if b.GoVersion != runtime.Version() || b.Version == "" {
		t.Errorf("currentBuild() = %+v", b)
	}
	_, stdout, _ := runCLI(t, "version")
	if !strings.Contains(stdout, "Commit:     ") || strings.Contains(stdout, "Commit:     \n") {
		t.Errorf("version without ldflags printed an empty commit:\n%s", stdout)
	}
}

func TestHealthcheck(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz":
			w.Write([]byte("ok\n"))
		case "/redirect":
			http.Redirect(w, r, "/healthz", http.StatusFound)
		default:
			http.Error(w, "store unavailable", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	tests := []struct {
		args []string
		code int
		out  string // part of stdout (code 0) or stderr
	}{
		{[]string{"--url", srv.URL + "/healthz"}, 0, "/healthz: ok"},
		{[]string{"--url", srv.URL + "/readyz"}, 1, "answered 503 Service Unavailable: store unavailable"},
		{[]string{"--url", srv.URL + "/redirect"}, 1, "answered 302"},
		{[]string{"--url", "http://127.0.0.1:1/healthz", "--timeout", "1s"}, 1, "healthcheck: http://127.0.0.1:1/healthz"},
		{[]string{"--url", "127.0.0.1:7444/readyz"}, 1, "want http://HOST:PORT/PATH"},
		{nil, 1, "--url is required"},
	}
	for _, tt := range tests {
		code, stdout, stderr := runCLI(t, append([]string{"healthcheck"}, tt.args...)...)
		got := stdout
		if tt.code != 0 {
			got = stderr
		}
		if code != tt.code || !strings.Contains(got, tt.out) {
			t.Errorf("healthcheck %v = %d, stdout %q, stderr %q; want %d and %q", tt.args, code, stdout, stderr, tt.code, tt.out)
		}
	}
}

// TestPprofRefusesNonLoopback: every server command refuses to expose
// profiles beyond this machine, before it starts anything.
func TestPprofRefusesNonLoopback(t *testing.T) {
	discoveryDir := filepath.Join(t.TempDir(), "d")
	for _, args := range [][]string{
		{"agent", "run", "--data", t.TempDir()},
		{"discovery", "--data", discoveryDir},
		{"authority", "--data", t.TempDir()},
	} {
		code, _, stderr := runCLI(t, append(args, "--pprof-listen", "0.0.0.0:6060")...)
		if code == 0 || !strings.Contains(stderr, "pprof listens only on a loopback address") {
			t.Errorf("%v --pprof-listen 0.0.0.0:6060 = %d %q, want a refusal", args, code, stderr)
		}
	}
	if _, err := os.Stat(discoveryDir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("discovery refused --pprof-listen but created its data directory (%v)", err)
	}
}

// TestEveryLeafCommandHasExamples: --help of every command that does
// something shows how to call it.
func TestEveryLeafCommandHasExamples(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if !c.HasSubCommands() && c.Runnable() && strings.TrimSpace(c.Example) == "" {
			t.Errorf("%s has no Example", c.CommandPath())
		}
		checkExamples(t, c)
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(newRoot(&Env{}))
}

// checkExamples parses the flags of each example of c with c's own flag
// set, so an example cannot name a flag the command lacks.
func checkExamples(t *testing.T, c *cobra.Command) {
	t.Helper()
	for _, line := range strings.Split(c.Example, "\n") {
		words := strings.Fields(line)
		for len(words) > 0 && strings.Contains(words[0], "=") { // VAR=value prefixes
			words = words[1:]
		}
		if len(words) == 0 || words[0] != "muster" {
			continue
		}
		root := newRoot(&Env{})
		cmd, rest, err := root.Find(words[1:])
		if err != nil || cmd.CommandPath() != c.CommandPath() {
			t.Errorf("example %q of %s runs %v (%v)", line, c.CommandPath(), cmd.CommandPath(), err)
			continue
		}
		if err := cmd.ParseFlags(rest); err != nil {
			t.Errorf("example %q of %s: %v", line, c.CommandPath(), err)
		}
	}
}

// TestReportedVersion: a build without a release version reports itself
// as unreleased, with its commit, never as "dev" (status printed "muster
// dev", which reads as the command).
func TestReportedVersion(t *testing.T) {
	defer func(v, c, d string) { Version, Commit, BuildDate = v, c, d }(Version, Commit, BuildDate)
	Version, Commit, BuildDate = "dev", "0123456789abcdef", ""
	if got := reportedVersion(); got != "unreleased build 0123456789ab" {
		t.Errorf("reportedVersion() = %q", got)
	}
	Version = "v1.2.3"
	if got := reportedVersion(); got != "v1.2.3" {
		t.Errorf("reportedVersion() = %q, want v1.2.3", got)
	}
}
