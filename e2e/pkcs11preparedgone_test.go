//go:build pkcs11 && cgo

package e2e

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/custody/softhsmtest"
)

// TestPKCS11PreparedKeyGoneIsNotActivated: a prepared agent intermediate
// whose key leaves the token (a token restored from a copy older than the
// prepare) is neither activated by an operator, who is told why and the
// way out, nor by the leader's clock, which discards it and prepares a
// successor in the token; a running agent renews throughout, ending under
// that successor. Activated, the role signed with a key that was not
// there: every renewal was refused until the agents' certificates
// expired.
func TestPKCS11PreparedKeyGoneIsNotActivated(t *testing.T) {
	t.Parallel()
	tok, env, dir := initCustody(t)
	// With 2m intermediates the leader activates the successor of init's
	// (a year long) 80 s after init.
	p, rec := startProcEnv(t, "authority", "authority started", env, "authority", "--data", dir,
		"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--log-format", "json",
		"--ca-intermediate-ttl", "2m", "--agent-cert-ttl", "20s")
	p.addr, _ = rec["advertise"].(string)
	e := &agentEnv{dir: dir, auth: p}
	adir := filepath.Join(t.TempDir(), "agent")
	if r := muster(t, nil, "agent", "join", "--data", adir, "--node", "n1", e.createToken(t).URI); r.code != 0 {
		t.Fatalf("join: %s", r.stderr)
	}
	startProc(t, "agent", "stream to the authority open", "agent", "run", "--data", adir, "--log-format", "json")
	first := activeIntermediate(t, dir, "agent").cert.SerialNumber.Text(16)

	out := mustRun(t, "ca", "rotate", "agent", "--data", dir)
	m := regexp.MustCompile(`Prepared the agent intermediate ([0-9a-f]+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("ca rotate agent says:\n%s", out)
	}
	gone := m[1]
	if out, err := tok.Command("pkcs11-tool", "--module", tok.Module, "--token-label", softhsmtest.Label, "--login", "--pin", softhsmtest.PIN,
		"--delete-object", "--type", "privkey", "--label", "muster-ca/agent/"+gone).CombinedOutput(); err != nil {
		t.Fatalf("pkcs11-tool --delete-object: %v\n%s", err, out)
	}

	// The operator: refused once it is published, naming the key and the
	// way out.
	var r result
	waitFor(t, 60*time.Second, "ca rotate agent --activate past the publish window", func() bool {
		r = muster(t, env, "ca", "rotate", "agent", "--activate", "--data", dir)
		return r.code == 0 || !strings.Contains(r.stderr, "not published by every replica yet") && !strings.Contains(r.stderr, "has not read the prepared")
	})
	wayOut := "muster-pkcs11 ca rotate agent --offline --data " + dir
	if r.code == 0 || !strings.Contains(r.stderr, "cannot be activated") || !strings.Contains(r.stderr, "not in the PKCS#11 token") || !strings.Contains(r.stderr, wayOut) {
		t.Fatalf("activating a prepared intermediate whose key is gone: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// The leader: discards it when its activation is due, and prepares
	// and activates a successor in the token.
	waitFor(t, 150*time.Second, "the leader discards the keyless prepared intermediate", func() bool {
		for _, a := range auditOf(t, dir, "ca.discard") {
			if a.Target == "agent/"+gone && a.Result == "ok" && strings.Contains(a.Reason, "not in the PKCS#11 token") {
				return true
			}
		}
		return false
	})
	var next string
	waitFor(t, 60*time.Second, "the leader activates a successor in the token", func() bool {
		next = activeIntermediate(t, dir, "agent").cert.SerialNumber.Text(16)
		return next != first
	})
	if next == gone {
		t.Fatalf("the leader activated %s, whose key is not in the token", gone)
	}
	waitFor(t, agentReach, "the agent renews under the successor", func() bool {
		return agentLeaf(t, adir).CheckSignatureFrom(activeIntermediate(t, dir, "agent").cert) == nil
	})
	for _, a := range auditOf(t, dir, "ca.activate") {
		// Refusals name the intermediate too (the CLI sends the serial it
		// read from ca status); only an activation that went through is wrong.
		if a.Target == "agent/"+gone && a.Result == "ok" {
			t.Errorf("activated with its key gone: %+v", a)
		}
	}
	if body, err := scrapePath(p.metrics, "/readyz"); err != nil || body != "ready\n" {
		t.Errorf("/readyz: %q %v", body, err)
	}
	if st := agentStatus(t, adir); st["expired"] != false {
		t.Errorf("agent status: %v", st)
	}
}
