//go:build pkcs11 && cgo

package e2e

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/custody/softhsmtest"
)

// TestPKCS11DeletedKeyAgentsRetry: the active agent intermediate's object
// deleted from the token under a running authority. A renewal is answered
// UNAVAILABLE (agents retry it, as they do a store outage), not INTERNAL
// (which stops `muster agent run` for good, a machine to touch); the way
// out the error names, a successor made in the token and activated, brings
// renewals back without restarting the authority or touching the agent.
func TestPKCS11DeletedKeyAgentsRetry(t *testing.T) {
	t.Parallel()
	tok := softhsmtest.New(t)
	env := tok.Env()
	dir := filepath.Join(t.TempDir(), "authority")
	if r := muster(t, env, "init", "--data", dir, "--custody", tok.URI, "--pkcs11-module", tok.Module, "--pkcs11-pin-file", tok.PINFile); r.code != 0 {
		t.Fatalf("init --custody: exit %d\n%s", r.code, r.stderr)
	}
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
	if r.code == 0 || !strings.Contains(r.stderr, "UNAVAILABLE") || !strings.Contains(r.stderr, "key custody unavailable") {
		t.Fatalf("renewal with the agent intermediate's object deleted: exit %d, want UNAVAILABLE naming key custody:\n%s", r.code, r.stderr)
	}
	if !strings.Contains(p.Logs(), "muster ca rotate ROLE --activate") {
		t.Errorf("the authority's log does not name the way out:\n%s", p.Logs())
	}

	mustRun(t, "ca", "rotate", "agent", "--data", dir)
	waitFor(t, 60*time.Second, "the agent successor made in the token is activated", func() bool {
		return muster(t, nil, "ca", "rotate", "agent", "--activate", "--data", dir).code == 0
	})
	mustRun(t, "agent", "renew", "--data", adir)
}
