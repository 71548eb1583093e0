//go:build pkcs11 && cgo

package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPKCS11TokenAwayKeepsTheListenerServing: with the CA keys in a
// SoftHSM2 token, a server intermediate is activated while the token is
// away (its directory moved, as a removed HSM), so the next handshake
// wants a listener certificate the token cannot sign. The listener goes
// on with the certificate it holds, still valid, so operators' calls that
// need no signature are answered (muster ca status) instead of every
// handshake failing with "tls: internal error"; once the token is back
// the listener certificate is re-issued under the new intermediate.
func TestPKCS11TokenAwayKeepsTheListenerServing(t *testing.T) {
	t.Parallel()
	tok, env, dir := initCustody(t)
	p, rec := startProcEnv(t, "authority", "authority started", env,
		"authority", "--data", dir, "--listen", freePort(t), "--metrics-listen", "127.0.0.1:0", "--log-format", "json")
	p.addr, _ = rec["advertise"].(string)

	mustRun(t, "ca", "rotate", "server", "--data", dir)
	// The authority reads the prepared intermediate (and opens its key)
	// after the call returns: the token goes away only once it has, or
	// the replica cannot read the store's intermediates and, rightly,
	// takes no CA step (the activation below would never come).
	waitFor(t, 30*time.Second, "the prepared intermediate in the trust bundle", func() bool {
		return strings.Contains(p.Logs(), `"intermediates":5`)
	})
	// The token's own directory moved out, as SoftHSM2 sees a removed
	// token: its slot is gone.
	tokens := filepath.Join(filepath.Dir(tok.Conf), "tokens")
	entries, err := os.ReadDir(tokens)
	if err != nil || len(entries) != 1 {
		t.Fatalf("the token directory %s: %v, %d entries", tokens, err, len(entries))
	}
	in, away := filepath.Join(tokens, entries[0].Name()), filepath.Join(filepath.Dir(tok.Conf), "away")
	if err := os.Rename(in, away); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			if err := os.Rename(away, in); err != nil {
				t.Error(err)
			}
		}
	}
	defer restore()
	waitFor(t, 60*time.Second, "the server successor activated (its publish window over)", func() bool {
		return muster(t, nil, "ca", "rotate", "server", "--activate", "--data", dir).code == 0
	})

	// A new connection: the listener cannot re-issue its certificate.
	if r := muster(t, nil, "ca", "status", "--data", dir); r.code != 0 {
		t.Fatalf("ca status with the token away: exit %d\n%s", r.code, r.stderr)
	}
	if !strings.Contains(p.Logs(), "the listener certificate could not be re-issued") {
		t.Errorf("the authority did not say it serves the held listener certificate:\n%s", p.Logs())
	}

	restore()
	waitFor(t, 90*time.Second, "the listener certificate re-issued once the token is back", func() bool {
		muster(t, nil, "ca", "status", "--data", dir)
		return strings.Contains(p.Logs(), "the listener certificate re-issued again")
	})
}
