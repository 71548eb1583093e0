// Package softhsmtest starts a private SoftHSM2 token for a test: its own
// configuration file and token directory in the test's temp dir, found by
// the module through SOFTHSM2_CONF. A test that loads the module itself
// (in-process) uses Start, which sets SOFTHSM2_CONF for the whole test
// binary (so the test cannot call t.Parallel); a test whose token is used
// only by the processes it starts (the e2e tests) uses New and gives those
// processes Token.Env (or runs tools through Token.Command), so that tests
// with a token each run in parallel. Like pgtest for PostgreSQL, a missing
// SoftHSM2 skips the test on a developer's machine and fails it where
// MUSTER_REQUIRE_SOFTHSM=1 (set by .ci/run) or CI is set.
package softhsmtest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// RequireEnv set to 1 makes a missing SoftHSM2 fail the tests.
const RequireEnv = "MUSTER_REQUIRE_SOFTHSM"

// required reports whether a missing SoftHSM2 must fail the tests: where
// RequireEnv is 1 or CI is set (as e2e's skipUnlessRequired), a skip would
// be a check CI never makes.
func required() bool { return os.Getenv(RequireEnv) == "1" || os.Getenv("CI") != "" }

// Module is where Debian's softhsm2 package puts the PKCS#11 module.
const Module = "/usr/lib/softhsm/libsofthsm2.so"

// Label, PIN and SOPIN of every test token.
const (
	Label = "muster"
	PIN   = "1234"
	SOPIN = "5678"
)

// ErrNotInstalled: softhsm2-util or the module is missing.
var ErrNotInstalled = errors.New("SoftHSM2 is not installed (apt-get install softhsm2 opensc)")

// Token is a test's token.
type Token struct {
	// Conf is the SoftHSM2 configuration file; SOFTHSM2_CONF names it.
	Conf string
	// Module is the PKCS#11 library.
	Module string
	// URI names the token (RFC 7512).
	URI string
	// PINFile holds PIN, mode 0600.
	PINFile string
}

// Env is the environment a process needs to see this token: its
// configuration file, and nothing else (no PIN: a muster process reads it
// from PINFile, --pkcs11-pin-file).
func (t Token) Env() []string { return []string{"SOFTHSM2_CONF=" + t.Conf} }

// Command is a tool (softhsm2-util, pkcs11-tool) run against this token:
// the test binary's environment, whatever SOFTHSM2_CONF it names replaced
// by this token's.
func (t Token) Command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SOFTHSM2_CONF=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, t.Env()...)
	return cmd
}

// Start makes a token (New) and points SOFTHSM2_CONF at it for this test,
// for a test that loads the module in its own process. t.Setenv forbids
// t.Parallel: a test whose token only the processes it starts use calls
// New instead.
func Start(tb testing.TB) Token {
	tb.Helper()
	tok := New(tb)
	tb.Setenv("SOFTHSM2_CONF", tok.Conf)
	return tok
}

// New makes a token with its own configuration file and token directory
// in a temp dir of this test, leaving the test binary's environment
// alone: the processes that use it are given Env (or run by Command).
func New(tb testing.TB) Token {
	tb.Helper()
	util, err := exec.LookPath("softhsm2-util")
	if err == nil {
		if _, err = os.Stat(Module); err != nil {
			err = ErrNotInstalled
		}
	} else {
		err = ErrNotInstalled
	}
	if err != nil {
		if required() {
			tb.Fatalf("softhsmtest: %v (%s=1 or CI is set: these tests must not be skipped)", err, RequireEnv)
		}
		tb.Skipf("softhsmtest: skipped: %v", err)
	}
	dir := tb.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "tokens"), 0o700); err != nil {
		tb.Fatal(err)
	}
	conf := filepath.Join(dir, "softhsm2.conf")
	body := fmt.Sprintf("directories.tokendir = %s\nobjectstore.backend = file\nlog.level = ERROR\n", filepath.Join(dir, "tokens"))
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		tb.Fatal(err)
	}
	pinFile := filepath.Join(dir, "pin")
	if err := os.WriteFile(pinFile, []byte(PIN+"\n"), 0o600); err != nil {
		tb.Fatal(err)
	}
	tok := Token{Conf: conf, Module: Module, URI: "pkcs11:token=" + Label, PINFile: pinFile}
	out, err := tok.Command(util, "--init-token", "--free", "--label", Label, "--pin", PIN, "--so-pin", SOPIN).CombinedOutput()
	if err != nil {
		tb.Fatalf("softhsmtest: softhsm2-util --init-token: %v\n%s", err, out)
	}
	return tok
}
