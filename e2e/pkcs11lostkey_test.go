//go:build pkcs11 && cgo

package e2e

import (
	"encoding/json"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/custody/softhsmtest"
)

// TestPKCS11LostActiveKey: the active agent intermediate's key deleted
// from the token (a token restored without it) stops the authority's
// start with a refusal, audited, that names muster ca rotate agent
// --offline --data DIR; that command, pasted, replaces the intermediate
// under the root with a key in the token, and the authority then starts,
// ready, and joins an agent.
func TestPKCS11LostActiveKey(t *testing.T) {
	t.Parallel()
	tok, env, dir := initCustody(t)
	pkcs11Tool := func(args ...string) string {
		t.Helper()
		out, err := tok.Command("pkcs11-tool", append([]string{"--module", tok.Module, "--token-label", softhsmtest.Label, "--login", "--pin", softhsmtest.PIN}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("pkcs11-tool %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	label := regexp.MustCompile(`muster-ca/agent/[0-9a-f]+`).FindString(pkcs11Tool("--list-objects", "--type", "privkey"))
	if label == "" {
		t.Fatal("no agent intermediate's key in the token")
	}
	pkcs11Tool("--delete-object", "--type", "privkey", "--label", label)

	authArgs := []string{"authority", "--data", dir, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--log-format", "json"}
	r := muster(t, env, authArgs...)
	if r.code == 0 {
		t.Fatalf("the authority started with its active agent key gone\n%s", r.stderr)
	}
	wayOut := "muster-pkcs11 ca rotate agent --offline --data " + dir
	if !strings.Contains(r.stderr, wayOut) || !strings.Contains(r.stderr, "not in the PKCS#11 token") {
		t.Fatalf("the refusal does not name the lost key and %q:\n%s", wayOut, r.stderr)
	}
	r = muster(t, env, "audit", "list", "--offline", "--data", dir, "--action", "authority.start", "-o", "json")
	var a []struct{ Result, Reason string }
	if err := json.Unmarshal([]byte(r.stdout), &a); err != nil {
		t.Fatalf("audit list --offline: %v\n%s%s", err, r.stdout, r.stderr)
	}
	if len(a) == 0 || a[len(a)-1].Result != "denied" || !strings.Contains(a[len(a)-1].Reason, wayOut) {
		t.Errorf("the refusal is not audited: %+v", a)
	}

	// The way out, as the refusal prints it.
	args := strings.Fields(wayOut)[1:]
	r = muster(t, env, args...)
	if r.code != 0 {
		t.Fatalf("%s: exit %d\n%s%s", wayOut, r.code, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stdout, "Activated the agent intermediate") {
		t.Errorf("%s says:\n%s", wayOut, r.stdout)
	}
	p, rec := startProcEnv(t, "authority", "authority started", env, authArgs...)
	p.addr, _ = rec["advertise"].(string)
	waitFor(t, 30*time.Second, "the authority is ready", func() bool {
		body, err := scrapePath(p.metrics, "/readyz")
		return err == nil && body == "ready\n"
	})
	e := &agentEnv{dir: dir, auth: p}
	adir := filepath.Join(t.TempDir(), "agent")
	if r := muster(t, nil, "agent", "join", "--data", adir, "--node", "n1", e.createToken(t).URI); r.code != 0 {
		t.Fatalf("join after the offline rotation: %s", r.stderr)
	}
	if out := mustRun(t, "ca", "status", "--data", dir); !strings.Contains(out, "retiring") {
		t.Errorf("ca status after the offline rotation shows no retiring intermediate:\n%s", out)
	}
}

// TestPKCS11RotateOfflineBesideTheAuthority: the active agent
// intermediate's key deleted from the token under a running authority,
// which reports not ready naming muster ca rotate agent --offline --data
// DIR; that command, pasted, runs beside the authority on the same data
// directory (it needs no stop: the store's conditional writes, and the
// audit files under DIR/audit.lock), the authority takes the new
// intermediate without a restart and is ready again, an agent renews, and
// once stopped the audit chain verifies with audit-head at its newest
// record.
func TestPKCS11RotateOfflineBesideTheAuthority(t *testing.T) {
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
	wayOut := "muster-pkcs11 ca rotate agent --offline --data " + dir
	var notReady string
	waitFor(t, 60*time.Second, "the authority reports the lost key and the way out on /readyz", func() bool {
		notReady, _ = scrapePath(p.metrics, "/readyz")
		return strings.Contains(notReady, wayOut)
	})

	// The way out, pasted, beside the running authority.
	if r := muster(t, env, strings.Fields(wayOut)[1:]...); r.code != 0 || !strings.Contains(r.stdout, "Activated the agent intermediate") {
		t.Fatalf("%s beside the running authority: exit %d\n%s%s", wayOut, r.code, r.stdout, r.stderr)
	}
	waitFor(t, 60*time.Second, "the authority is ready again without a restart", func() bool {
		body, err := scrapePath(p.metrics, "/readyz")
		return err == nil && body == "ready\n"
	})
	mustRun(t, "agent", "renew", "--data", adir)
	p.stop(t)
	auditHeadAtChainHead(t, dir, env)
}
