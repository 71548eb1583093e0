package e2e

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// lookupVersion looks an authority up through the CLI: its registered
// version, or 0 and the error line (NOT_FOUND…).
func lookupVersion(t *testing.T, d *discoveryProc, id string) (int64, string) {
	t.Helper()
	r := muster(t, nil, "discovery", "lookup", id, "--discovery", d.addr, "--discovery-fingerprint", d.fingerprint, "-o", "json")
	if r.code != 0 {
		return 0, r.stderr
	}
	var res struct {
		AuthorityID string `json:"authority_id"`
		Version     int64  `json:"version"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || res.AuthorityID != id {
		t.Fatalf("lookup -o json printed %q: %v", r.stdout, err)
	}
	return res.Version, ""
}

// waitLookup waits until discovery serves the authority and returns its
// version.
func waitLookup(t *testing.T, d *discoveryProc, id string) int64 {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		v, errLine := lookupVersion(t, d, id)
		if v > 0 {
			return v
		}
		if !strings.Contains(errLine, "NOT_FOUND") || time.Now().After(deadline) {
			t.Fatalf("lookup of %s: %s\n%s", id, errLine, d.Logs())
		}
	}
}

// TestDiscoveryAllowList: discovery accepts only the authorities it was
// told to, under their own roots; muster discovery forget frees an ID,
// and the allowed authority registers it again.
func TestDiscoveryAllowList(t *testing.T) {
	t.Parallel()
	allowedDir, allowed := initDir(t)
	otherDir, other := initDir(t, "--name", "other")
	allowedID, otherID := allowed["authority_id"].(string), other["authority_id"].(string)
	ddir := filepath.Join(t.TempDir(), "discovery")
	d := startDiscovery(t, ddir, allowing(allowed)...)
	discoveryArgs := []string{"--discovery", d.addr, "--discovery-fingerprint", d.fingerprint}

	// An authority not on the list: refused, and it says so.
	refused := startAuthority(t, otherDir, discoveryArgs...)
	want := "authority ID " + otherID + " is not allowed at this discovery: start it with --allow-authority " + otherID + "=sha256:…"
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(refused.Logs(), want); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the authority did not log its refusal %q:\n%s", want, refused.Logs())
		}
	}
	if !strings.Contains(refused.Logs(), "PermissionDenied") {
		t.Errorf("the refusal is not PERMISSION_DENIED:\n%s", refused.Logs())
	}
	if v, errLine := lookupVersion(t, d, otherID); v != 0 || !strings.Contains(errLine, "NOT_FOUND") {
		t.Errorf("lookup of the refused authority: version %d, %q; want NOT_FOUND", v, errLine)
	}
	refused.stop(t)

	// The authority on the list registers.
	auth := startAuthority(t, allowedDir, discoveryArgs...)
	if v := waitLookup(t, d, allowedID); v != 1 {
		t.Errorf("registered version %d, want 1", v)
	}

	// forget, while discovery runs: the ID is no longer served. The
	// authority stopped first: running, it registers again within 30 s.
	auth.stop(t)
	var res struct {
		AuthorityID   string    `json:"authority_id"`
		CAFingerprint string    `json:"ca_fingerprint"`
		Version       int64     `json:"version"`
		RegisteredAt  time.Time `json:"registered_at"`
	}
	out := mustRun(t, "discovery", "forget", allowedID, "--data", ddir, "-o", "json")
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("forget -o json printed %q: %v", out, err)
	}
	if res.AuthorityID != allowedID || res.CAFingerprint != allowed["ca_fingerprint"] || res.Version != 1 || res.RegisteredAt.IsZero() {
		t.Errorf("forget = %+v", res)
	}
	if v, errLine := lookupVersion(t, d, allowedID); v != 0 || !strings.Contains(errLine, "NOT_FOUND") {
		t.Errorf("lookup after forget: version %d, %q; want NOT_FOUND", v, errLine)
	}
	line := mustFail(t, "discovery", "forget", allowedID, "--data", ddir)
	if !strings.Contains(line, "is not registered with this discovery") {
		t.Errorf("forget again: %q", line)
	}

	// The allowed authority registers again (at its next start here), from
	// version 1: a new registration.
	startAuthority(t, allowedDir, discoveryArgs...)
	if v := waitLookup(t, d, allowedID); v != 1 {
		t.Errorf("version after the forget %d, want 1", v)
	}
	text := mustRun(t, "discovery", "forget", allowedID, "--data", ddir)
	if !strings.Contains(text, "Forgot authority "+allowedID) || !strings.Contains(text, allowed["ca_fingerprint"].(string)) {
		t.Errorf("forget printed %q", text)
	}
}

// TestDiscoveryRefusesAnUnspecifiedIssuer: listening on every address
// needs --advertise, or the ticket issuer would name no machine.
func TestDiscoveryRefusesAnUnspecifiedIssuer(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "discovery")
	for _, listen := range []string{"0.0.0.0:0", "[::]:0"} {
		line := mustFail(t, "discovery", "--data", dir, "--listen", listen, "--metrics-listen", "")
		if !strings.Contains(line, "would name no machine") || !strings.Contains(line, "set --advertise") {
			t.Errorf("discovery --listen %s: %q", listen, line)
		}
	}
	// With --advertise it starts.
	startDiscovery(t, dir, "--listen", "0.0.0.0:0", "--advertise", "discovery.example:7450")
}
