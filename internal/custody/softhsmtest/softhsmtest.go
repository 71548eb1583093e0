// Package softhsmtest starts a private SoftHSM2 token for a test: its own
// token directory in a temp dir, found by the module through SOFTHSM2_CONF.
// Like pgtest for PostgreSQL, a missing SoftHSM2 skips the test on a
// developer's machine and fails it where MUSTER_REQUIRE_SOFTHSM=1 (set by
// .ci/run).
package softhsmtest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// RequireEnv set to 1 makes a missing SoftHSM2 fail the tests.
const RequireEnv = "MUSTER_REQUIRE_SOFTHSM"

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

// Env is the environment a process needs to see this token.
func (t Token) Env() []string { return []string{"SOFTHSM2_CONF=" + t.Conf} }

// Start makes a token in a temp dir and points SOFTHSM2_CONF at it for
// this test (and the processes it starts).
func Start(tb testing.TB) Token {
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
		if os.Getenv(RequireEnv) == "1" {
			tb.Fatalf("softhsmtest: %v (%s=1: these tests must not be skipped)", err, RequireEnv)
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
	tb.Setenv("SOFTHSM2_CONF", conf)
	out, err := exec.Command(util, "--init-token", "--free", "--label", Label, "--pin", PIN, "--so-pin", SOPIN).CombinedOutput()
	if err != nil {
		tb.Fatalf("softhsmtest: softhsm2-util --init-token: %v\n%s", err, out)
	}
	pinFile := filepath.Join(dir, "pin")
	if err := os.WriteFile(pinFile, []byte(PIN+"\n"), 0o600); err != nil {
		tb.Fatal(err)
	}
	return Token{Conf: conf, Module: Module, URI: "pkcs11:token=" + Label, PINFile: pinFile}
}
