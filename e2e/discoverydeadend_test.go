package e2e

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// pastedCommand runs the muster command a message names, from "muster "
// up to the word that ends it, as an operator pastes it.
func pastedCommand(t *testing.T, msg, start, end string) result {
	t.Helper()
	i := strings.Index(msg, start)
	if i < 0 {
		t.Fatalf("the message names no %q:\n%s", start, msg)
	}
	cmd, _, ok := strings.Cut(msg[i:], end)
	if !ok {
		t.Fatalf("the command in the message does not end at %q:\n%s", end, msg)
	}
	return muster(t, nil, strings.Fields(strings.TrimPrefix(cmd, "muster "))...)
}

// TestDiscoveryJoinAuthorityDown: discovery lists an authority that is not
// running. The join says so with UNAVAILABLE (which agent run retries),
// rather than that no endpoint "proved to be it", and names a lookup
// command that works pasted; once the authority runs again the same join
// succeeds.
func TestDiscoveryJoinAuthorityDown(t *testing.T) {
	t.Parallel()
	e := newReferralEnv(t, "")
	e.auth.stop(t)

	adir := filepath.Join(t.TempDir(), "web-01")
	r := e.join(t, adir, "web-01", e.psk)
	wantJoinFailure(t, r, "UNAVAILABLE", "authority "+e.authorityID+" does not answer at "+e.auth.addr)
	if strings.Contains(r.stderr, "proved to be it") {
		t.Errorf("an authority that does not answer is reported as one that failed its proof: %s", r.stderr)
	}
	look := pastedCommand(t, r.stderr, "muster discovery lookup", " shows")
	if look.code != 0 || !strings.Contains(look.stdout, e.auth.addr) {
		t.Fatalf("the lookup the refusal names, pasted: exit %d\n%s%s", look.code, look.stdout, look.stderr)
	}

	e.auth = startAuthority(t, e.dir, "--discovery", e.disc.addr, "--discovery-fingerprint", e.disc.fingerprint)
	e.waitRegistered(t)
	// The restarted authority listens on a new port, which its
	// registration at start gives discovery.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if r = e.join(t, adir, "web-01", e.psk); r.code == 0 {
			break
		}
		if time.Now().After(deadline) || !strings.Contains(r.stderr, "UNAVAILABLE") {
			t.Fatalf("join once the authority runs again: exit %d\n%s", r.code, r.stderr)
		}
	}
}

// TestDiscoveryJoinPinnedToAnotherRoot: an agent pinned to a root that is
// not the authority's (the root before a rotation's standby, or a
// fingerprint copied from the wrong place) is stopped before the PSK
// leaves, through discovery or directly, and told where the fingerprint to
// pin comes from; pinning that one joins.
func TestDiscoveryJoinPinnedToAnotherRoot(t *testing.T) {
	t.Parallel()
	e := newReferralEnv(t, "")
	wrong := "sha256:" + strings.Repeat("ab", 32)

	through := e.join(t, filepath.Join(t.TempDir(), "a"), "web-01", e.psk, "--ca-fingerprint", wrong)
	wantJoinFailure(t, through, "PERMISSION_DENIED", "muster ca root status on the authority")
	direct := muster(t, []string{"MUSTER_BOOTSTRAP_PSK=" + e.psk}, "agent", "join", "--data", filepath.Join(t.TempDir(), "b"),
		"--node", "web-01", "--authority", e.auth.addr, "--ca-fingerprint", wrong)
	wantJoinFailure(t, direct, "the PSK was not sent", "muster ca root status on the authority")

	// The way out, on the authority: the line the message names.
	status := mustRun(t, "ca", "root", "status", "--data", e.dir)
	m := regexp.MustCompile(`Joining URIs pin: (sha256:[0-9a-f]{64})`).FindStringSubmatch(status)
	if m == nil || !strings.Contains(through.stderr, `"Joining URIs pin"`) {
		t.Fatalf("muster ca root status prints no pin the refusal names:\n%s\nrefusal: %s", status, through.stderr)
	}
	if r := e.join(t, filepath.Join(t.TempDir(), "c"), "web-01", e.psk, "--ca-fingerprint", m[1]); r.code != 0 {
		t.Fatalf("join pinned to the root ca root status prints: exit %d\n%s", r.code, r.stderr)
	}
}

// TestDiscoveryRestartedWithoutItsAllowList: discovery started again
// without the --allow-authority it had keeps the registration but no
// longer serves it. The agent's refusal is the one for an ID never
// registered (anyone may ask), which names the flag among the ways out;
// discovery's audit record of it says which applies. Started with it, the
// join goes through.
func TestDiscoveryRestartedWithoutItsAllowList(t *testing.T) {
	t.Parallel()
	e := newReferralEnv(t, "")
	e.mustJoin(t, "web-01")
	e.disc.stop(t)
	e.disc = startDiscovery(t, e.discDir, "--listen", e.disc.addr)

	r := e.join(t, filepath.Join(t.TempDir(), "web-02"), "web-02", e.psk)
	wantJoinFailure(t, r, "NOT_FOUND", "is not registered with this discovery: check the authority ID")
	if !strings.Contains(r.stderr, "--allow-authority "+e.authorityID+"=sha256:") {
		t.Errorf("the refusal names no --allow-authority for %s: %s", e.authorityID, r.stderr)
	}
	audit := mustRun(t, "discovery", "audit", "list", "--data", e.discDir, "--action", "authority.lookup")
	if !strings.Contains(audit, "this discovery's allow-list does not admit it") || !strings.Contains(audit, "--allow-authority "+e.authorityID+"=sha256:") {
		t.Errorf("discovery's audit record of the refusal names no way out:\n%s", audit)
	}

	// The way out: the flag, with the fingerprint muster init printed.
	e.disc.stop(t)
	e.disc = startDiscovery(t, e.discDir, "--listen", e.disc.addr, "--allow-authority", e.authorityID+"="+e.fingerprint)
	e.mustJoin(t, "web-02")

	// An ID that never registered is told what to check instead.
	r = e.join(t, filepath.Join(t.TempDir(), "web-03"), "web-03", e.psk, "--authority-id", "prod-000000")
	wantJoinFailure(t, r, "NOT_FOUND", "is not registered with this discovery: check the authority ID")
}

// TestDiscoveryJoinWithAnotherDiscoveryPin: an agent pinning discovery to
// another key (the authority's root fingerprint given by mistake, or the
// CA of a discovery whose directory was made anew) is stopped at the
// handshake and told which pin it needs and which command prints it;
// pinning that one joins.
func TestDiscoveryJoinWithAnotherDiscoveryPin(t *testing.T) {
	t.Parallel()
	e := newReferralEnv(t, "")
	r := e.join(t, filepath.Join(t.TempDir(), "a"), "web-01", e.psk, "--discovery-fingerprint", e.fingerprint)
	wantJoinFailure(t, r, "does not match the pinned fingerprint", "muster discovery show --data DIR prints on discovery's machine")

	show := showDiscovery(t, e.discDir)
	if r := e.join(t, filepath.Join(t.TempDir(), "b"), "web-01", e.psk, "--discovery-fingerprint", show.Fingerprint); r.code != 0 {
		t.Fatalf("join pinned to the fingerprint discovery show prints: exit %d\n%s", r.code, r.stderr)
	}
}
