//go:build pkcs11 && cgo

package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPKCS11RootStatusWithTheTokenAway: during a root rotation whose new
// root's key is in the token, muster ca root status answers with the
// token away (it signs nothing), as muster ca status does; it opened the
// roots' keys and answered UNAVAILABLE, so the operator could not see
// where the rotation stood while the token was gone. A step that needs
// the key is refused naming the token and the way out, audited from its
// phase (it said "see its log", audited as "->?").
func TestPKCS11RootStatusWithTheTokenAway(t *testing.T) {
	t.Parallel()
	tok, env, dir := initCustody(t)
	p, rec := startProcEnv(t, "authority", "authority started", env,
		"authority", "--data", dir, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--log-format", "json")
	p.addr, _ = rec["advertise"].(string)
	mustRun(t, "ca", "root", "rotate", "--data", dir)
	mustRun(t, "ca", "root", "next-phase", "--data", dir)

	tokens := filepath.Join(filepath.Dir(tok.Conf), "tokens")
	entries, err := os.ReadDir(tokens)
	if err != nil || len(entries) != 1 {
		t.Fatalf("the token directory %s: %v, %d entries", tokens, err, len(entries))
	}
	in, away := filepath.Join(tokens, entries[0].Name()), filepath.Join(filepath.Dir(tok.Conf), "away")
	if err := os.Rename(in, away); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := os.Rename(away, in); err != nil {
			t.Error(err)
		}
	}()
	// The authority learns the token is gone at its next use of it.
	waitFor(t, 60*time.Second, "the authority notices the token is away", func() bool {
		body, _ := scrapePath(p.metrics, "/readyz")
		return strings.Contains(body, "PKCS#11 token unavailable")
	})
	r := muster(t, nil, "ca", "root", "status", "--data", dir)
	if r.code != 0 || !strings.Contains(r.stdout, "Root rotation phase: update_agents") {
		t.Fatalf("ca root status with the token away: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := muster(t, nil, "ca", "status", "--data", dir); r.code != 0 {
		t.Errorf("ca status with the token away: exit %d\n%s", r.code, r.stderr)
	}
	// A step that needs the new root's key is refused saying what to do,
	// and audited from the phase it was asked in.
	const wayOut = "bring the token back"
	if r := muster(t, nil, "ca", "root", "next-phase", "--data", dir); r.code == 0 || !strings.Contains(r.stderr, "PKCS#11 token is unavailable") || !strings.Contains(r.stderr, wayOut) {
		t.Errorf("ca root next-phase with the token away: exit %d\n%s", r.code, r.stderr)
	}
	recs := auditOf(t, dir, "ca.root_phase")
	if last := recs[len(recs)-1]; last.Target != "update_agents->?" || last.Result == "ok" || !strings.Contains(last.Reason, wayOut) {
		t.Errorf("the refused step's record: %+v", last)
	}
}
