package pgtest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// ErrNotInstalled is returned by Start (wrapped) when no directory holding
// both initdb and pg_ctl was found.
var ErrNotInstalled = errors.New("PostgreSQL is not installed: no initdb and pg_ctl on PATH, " +
	"in `pg_config --bindir` or in /usr/lib/postgresql/*/bin; install it (apt-get install postgresql)")

// RequireEnv names the variable that, set to 1, makes a missing PostgreSQL
// a test failure instead of a skip. .ci/run sets it, and CI set does the
// same, so CI never skips the PostgreSQL tests.
const RequireEnv = "MUSTER_REQUIRE_POSTGRES"

// debianBins is where Debian and Ubuntu install each PostgreSQL version's
// programs (not on PATH).
const debianBins = "/usr/lib/postgresql/*/bin"

// BinDir returns the directory of the PostgreSQL server programs: the first
// directory on PATH that holds initdb and pg_ctl, else `pg_config
// --bindir` if it holds them, else the newest /usr/lib/postgresql/*/bin
// that does. Its error wraps ErrNotInstalled when there is none.
func BinDir() (string, error) {
	return findBinDir(os.Getenv("PATH"), debianBins)
}

// findBinDir is BinDir with the search path and the Debian glob as
// arguments, so that tests can point both at fake directories.
func findBinDir(path, debianGlob string) (string, error) {
	for _, dir := range filepath.SplitList(path) {
		// An empty PATH entry means the working directory to a shell;
		// never look there for a server to run as root.
		if dir != "" && filepath.IsAbs(dir) && hasServer(dir) {
			return dir, nil
		}
	}
	if dir, ok := pgConfigBinDir(path); ok && hasServer(dir) {
		return dir, nil
	}
	found, _ := filepath.Glob(debianGlob)
	found = slices.DeleteFunc(found, func(dir string) bool { return !hasServer(dir) })
	if len(found) > 0 {
		slices.SortFunc(found, func(a, b string) int {
			return compareVersions(filepath.Base(filepath.Dir(a)), filepath.Base(filepath.Dir(b)))
		})
		return found[len(found)-1], nil
	}
	return "", ErrNotInstalled
}

// pgConfigBinDir runs the first pg_config on path with --bindir.
func pgConfigBinDir(path string) (string, bool) {
	for _, dir := range filepath.SplitList(path) {
		if dir == "" || !filepath.IsAbs(dir) || !isExecutable(filepath.Join(dir, "pg_config")) {
			continue
		}
		out, err := exec.Command(filepath.Join(dir, "pg_config"), "--bindir").Output()
		if err != nil {
			return "", false
		}
		bin := strings.TrimSpace(string(out))
		return bin, bin != ""
	}
	return "", false
}

// hasServer reports whether dir holds the programs Start runs.
func hasServer(dir string) bool {
	return isExecutable(filepath.Join(dir, "initdb")) && isExecutable(filepath.Join(dir, "pg_ctl"))
}

func isExecutable(file string) bool {
	fi, err := os.Stat(file)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// compareVersions orders PostgreSQL version directories numerically,
// part by part, so that 10 comes after 9.6.
func compareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := range max(len(as), len(bs)) {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x - y
		}
	}
	return 0
}

// required reports whether a missing PostgreSQL must fail the tests: where
// RequireEnv is 1 or CI is set (as e2e's skipUnlessRequired), a skip would
// be a check CI never makes.
func required() bool { return os.Getenv(RequireEnv) == "1" || os.Getenv("CI") != "" }

// FailOrSkip ends tb when err, from Start, is not nil: a skip with one line
// saying how to install PostgreSQL when it is not installed (unless
// MUSTER_REQUIRE_POSTGRES=1 or CI is set), a failure otherwise. A server that is
// installed but cannot start always fails.
func FailOrSkip(tb testing.TB, err error) {
	tb.Helper()
	switch {
	case err == nil:
	case errors.Is(err, ErrNotInstalled) && !required():
		tb.Skipf("pgtest: skipped: %v", err)
	default:
		tb.Fatal(failure(err))
	}
}

// failure is the message of a server that did not start.
func failure(err error) string {
	if errors.Is(err, ErrNotInstalled) {
		return fmt.Sprintf("pgtest: %v (%s=1 or CI is set: these tests must not be skipped)", err, RequireEnv)
	}
	return fmt.Sprintf("pgtest: %v", err)
}
