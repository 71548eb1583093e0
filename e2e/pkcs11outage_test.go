//go:build pkcs11 && cgo

package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/custody/softhsmtest"
	"github.com/muster-dev/muster/internal/shellword"
)

// TestPKCS11StartRefusalsAreAudited: an authority whose token cannot be
// opened (a wrong PIN, a PIN file others can read, a missing PIN file, a
// module that is not where authority.json says, a module that cannot
// work: SoftHSM2 given a configuration whose token directory is not
// there, CKR_GENERAL_ERROR, told with its likely cause) refuses to start, says
// which module and PIN file it used and how to start once fixed, and
// records the refusal in the store's audit log, which the operator reads
// with no authority running. The PIN is in neither.
func TestPKCS11StartRefusalsAreAudited(t *testing.T) {
	t.Parallel()
	tok, env, dir := initCustody(t)
	pins := t.TempDir()
	wrong := filepath.Join(pins, "wrong")
	open := filepath.Join(pins, "open")
	if err := os.WriteFile(wrong, []byte("987654\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(open, []byte(softhsmtest.PIN+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	gone := filepath.Join(pins, "gone")
	noModule := filepath.Join(t.TempDir(), "libvendor-pkcs11.so")
	badConf := filepath.Join(t.TempDir(), "softhsm2.conf")
	if err := os.WriteFile(badConf, []byte("directories.tokendir = "+filepath.Join(filepath.Dir(badConf), "tokens")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		args []string
		want []string
		env  []string // in place of the token's environment
	}{
		{"wrong PIN", []string{"--pkcs11-pin-file", wrong}, []string{"the PIN is wrong or locked", "the PIN file " + wrong}, nil},
		{"PIN file others can read", []string{"--pkcs11-pin-file", open}, []string{"chmod 600", "the PIN file " + open}, nil},
		{"PIN file missing", []string{"--pkcs11-pin-file", gone}, []string{gone}, nil},
		{"module missing", []string{"--pkcs11-module", noModule}, []string{"module " + noModule, "the PIN file " + tok.PINFile}, nil},
		// Before, the bare code: "initialising the PKCS#11 module …: pkcs11: 0x5: CKR_GENERAL_ERROR".
		{"module cannot work", nil, []string{"CKR_GENERAL_ERROR is the module saying it cannot work", "SOFTHSM2_CONF is not set",
			"`pkcs11-tool --module " + tok.Module + " --list-token-slots`"}, []string{"SOFTHSM2_CONF=" + badConf}},
	} {
		args := append([]string{"authority", "--data", dir, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"}, tt.args...)
		runEnv := env
		if tt.env != nil {
			runEnv = tt.env
		}
		r := muster(t, runEnv, args...)
		if r.code == 0 {
			t.Fatalf("%s: the authority started\n%s", tt.name, r.stderr)
		}
		wayOut := "muster-pkcs11 authority --data " + dir
		for _, w := range append(tt.want, wayOut) {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("%s: the refusal does not say %q:\n%s", tt.name, w, r.stderr)
			}
		}
		if strings.Contains(r.stderr, softhsmtest.PIN) {
			t.Errorf("%s: the refusal shows the PIN:\n%s", tt.name, r.stderr)
		}
		r = muster(t, env, "audit", "list", "--offline", "--data", dir, "--action", "authority.start", "-o", "json")
		if r.code != 0 {
			t.Fatalf("%s: audit list --offline: exit %d\n%s", tt.name, r.code, r.stderr)
		}
		var a []struct{ Result, Reason string }
		if err := json.Unmarshal([]byte(r.stdout), &a); err != nil {
			t.Fatal(err)
		}
		if len(a) == 0 || a[len(a)-1].Result != "denied" || !strings.Contains(a[len(a)-1].Reason, tt.want[0]) ||
			!strings.Contains(a[len(a)-1].Reason, wayOut) {
			t.Errorf("%s: the refusal is not audited with its way out: %+v", tt.name, a)
		}
		if strings.Contains(r.stdout, softhsmtest.PIN) {
			t.Errorf("%s: the audit log holds the PIN: %s", tt.name, r.stdout)
		}
	}
}

// TestPKCS11DeletedKeyAgentsRetry: the active agent intermediate's object
// deleted from the token under a running authority. A renewal is answered
// UNAVAILABLE (agents retry it, as they do a store outage), not INTERNAL
// (which stops `muster agent run` for good, a machine to touch); the way
// out the error names, a successor made in the token and activated, brings
// renewals back without restarting the authority or touching the agent.
func TestPKCS11DeletedKeyAgentsRetry(t *testing.T) {
	t.Parallel()
	tok, env, dir := initCustody(t)
	p, rec := startProcEnv(t, "authority", "authority started", env, "authority", "--data", dir,
		"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--log-format", "json")
	p.addr, _ = rec["advertise"].(string)
	e := &agentEnv{dir: dir, auth: p}
	adir := filepath.Join(t.TempDir(), "agent")
	if r := muster(t, nil, "agent", "join", "--data", adir, "--node", "n1", e.createToken(t).URI); r.code != 0 {
		t.Fatalf("join: %s", r.stderr)
	}

	u, err := custody.ParsePKCS11URI(string(activeIntermediate(t, dir, "agent").ref))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := tok.Command("pkcs11-tool", "--module", tok.Module, "--token-label", softhsmtest.Label, "--login", "--pin", softhsmtest.PIN,
		"--delete-object", "--type", "privkey", "--label", u.Object).CombinedOutput(); err != nil {
		t.Fatalf("pkcs11-tool --delete-object: %v\n%s", err, out)
	}
	r := muster(t, nil, "agent", "renew", "--data", adir)
	if r.code == 0 || !strings.Contains(r.stderr, "UNAVAILABLE") || !strings.Contains(r.stderr, "not in the authority's PKCS#11 token") {
		t.Fatalf("renewal with the agent intermediate's object deleted: exit %d, want UNAVAILABLE saying the key is not in the token:\n%s", r.code, r.stderr)
	}
	// The way out names the key's role and the authority's directory,
	// and the commands below are what it says.
	// The refusal reaches the agent before the authority's log line is
	// read from its pipe: wait for it.
	wayOut := "muster ca rotate agent --activate --data " + shellword.Quote(dir)
	waitFor(t, 30*time.Second, "the authority's log names the way out", func() bool {
		return strings.Contains(p.Logs(), wayOut)
	})

	mustRun(t, "ca", "rotate", "agent", "--data", dir)
	waitFor(t, 60*time.Second, "the agent successor made in the token is activated", func() bool {
		return muster(t, nil, "ca", "rotate", "agent", "--activate", "--data", dir).code == 0
	})
	mustRun(t, "agent", "renew", "--data", adir)
}

// TestPKCS11LostTokenRefusalIsAudited: the token initialised again while
// the authority was stopped (its keys gone). The start is refused with
// what happened and the way out, and the refusal is in the audit log,
// where before it was a bare "stored key reference does not open" that
// nobody recorded.
func TestPKCS11LostTokenRefusalIsAudited(t *testing.T) {
	t.Parallel()
	tok, env, dir := initCustody(t)
	for _, args := range [][]string{
		{"--delete-token", "--token", softhsmtest.Label},
		{"--init-token", "--free", "--label", softhsmtest.Label, "--pin", softhsmtest.PIN, "--so-pin", softhsmtest.SOPIN},
	} {
		if out, err := tok.Command("softhsm2-util", args...).CombinedOutput(); err != nil {
			t.Fatalf("softhsm2-util %v: %v\n%s", args, err, out)
		}
	}
	r := muster(t, env, "authority", "--data", dir, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0")
	wayOut := "restore the token from its backup"
	if r.code == 0 || !strings.Contains(r.stderr, wayOut) || !strings.Contains(r.stderr, "muster-pkcs11 authority --data "+dir) {
		t.Fatalf("start over a token that lost its keys: exit %d, want a refusal naming the way out:\n%s", r.code, r.stderr)
	}
	r = muster(t, env, "audit", "list", "--offline", "--data", dir, "--action", "authority.start", "-o", "json")
	var a []struct{ Result, Reason string }
	if err := json.Unmarshal([]byte(r.stdout), &a); err != nil {
		t.Fatalf("audit list --offline: %v\n%s%s", err, r.stdout, r.stderr)
	}
	if len(a) == 0 || a[len(a)-1].Result != "denied" || !strings.Contains(a[len(a)-1].Reason, wayOut) {
		t.Errorf("the refusal is not audited: %+v", a)
	}
}
