package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/discoveryclient"
	"github.com/muster-dev/muster/internal/referral"
)

// allowing is the --allow-authority flag that lets the authority muster
// init printed init for register.
func allowing(init map[string]any) []string {
	return []string{"--allow-authority", init["authority_id"].(string) + "=" + init["ca_fingerprint"].(string)}
}

// startDiscovery starts discovery on OS-chosen loopback ports and waits for
// its "discovery started" log line, which names the bound address. extra
// are further flags (allowing, --store…).
func startDiscovery(t *testing.T, dir string, extra ...string) *discoveryProc {
	t.Helper()
	p, rec := startProc(t, "discovery", "discovery started", append([]string{"discovery", "--data", dir,
		"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--log-format", "json"}, extra...)...)
	p.addr = p.listen
	p.fingerprint, _ = rec["fingerprint"].(string)
	p.issuer, _ = rec["issuer"].(string)
	return p
}

type discoveryShow struct {
	Fingerprint string `json:"fingerprint"`
	Issuer      string `json:"issuer"`
	TicketKeys  []struct {
		ID           string     `json:"id"`
		Status       string     `json:"status"`
		CreatedAt    time.Time  `json:"created_at"`
		PublishUntil *time.Time `json:"publish_until"`
	} `json:"ticket_keys"`
}

func showDiscovery(t *testing.T, dir string) discoveryShow {
	t.Helper()
	var s discoveryShow
	out := mustRun(t, "discovery", "show", "--data", dir, "-o", "json")
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("discovery show -o json printed %q: %v", out, err)
	}
	return s
}

// servedKeys fetches the JWKS the way an authority does: over HTTPS,
// pinned by the fingerprint.
func servedKeys(t *testing.T, p *discoveryProc) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	data, err := discoveryclient.FetchJWKS(ctx, p.addr, p.fingerprint)
	if err != nil {
		t.Fatalf("fetching the JWKS: %v", err)
	}
	keys, err := referral.ParseJWKS(data)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for id := range keys {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func TestDiscovery(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "discovery")
	p := startDiscovery(t, dir)

	// show: the pin is the CA in DIR.
	caPEM, err := os.ReadFile(filepath.Join(dir, "tls", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	certs, err := ca.ParseCertsPEM(caPEM)
	if err != nil {
		t.Fatal(err)
	}
	s := showDiscovery(t, dir)
	if s.Fingerprint != ca.Fingerprint(certs[0]) || s.Fingerprint != p.fingerprint {
		t.Errorf("show fingerprint %s; the CA in DIR has %s, the start log says %s", s.Fingerprint, ca.Fingerprint(certs[0]), p.fingerprint)
	}
	if s.Issuer != "https://"+p.addr || p.issuer != s.Issuer {
		t.Errorf("show issuer %q, log issuer %q, want https://%s", s.Issuer, p.issuer, p.addr)
	}
	if len(s.TicketKeys) != 1 || s.TicketKeys[0].Status != "active" || s.TicketKeys[0].PublishUntil != nil {
		t.Fatalf("ticket keys after the first start: %+v, want one active key", s.TicketKeys)
	}
	first := s.TicketKeys[0].ID
	text := mustRun(t, "discovery", "show", "--data", dir)
	for _, want := range []string{"Fingerprint:  " + s.Fingerprint, "Issuer:       " + s.Issuer, first + "  active", "--discovery-fingerprint " + s.Fingerprint} {
		if !strings.Contains(text, want) {
			t.Errorf("discovery show printed\n%s\nwant it to contain %q", text, want)
		}
	}
	if got := servedKeys(t, p); !slices.Equal(got, []string{first}) {
		t.Errorf("served keys %v, want [%s]", got, first)
	}

	// lookup of an unknown authority: NOT_FOUND, one line, non-zero.
	line := mustFail(t, "discovery", "lookup", "nobody-abcdef", "--discovery", p.addr, "--discovery-fingerprint", p.fingerprint)
	if !strings.Contains(line, "NOT_FOUND") || !strings.Contains(line, "nobody-abcdef") {
		t.Errorf("lookup of an unknown authority printed %q, want NOT_FOUND naming it", line)
	}
	// The address may come from the environment; a wrong pin is refused.
	r := muster(t, []string{"MUSTER_DISCOVERY=" + p.addr}, "discovery", "lookup", "nobody-abcdef",
		"--discovery-fingerprint", "sha256:"+strings.Repeat("0", 64))
	if r.code == 0 || !strings.Contains(r.stderr, "UNAVAILABLE") || !strings.Contains(r.stderr, "fingerprint") {
		t.Errorf("lookup with a wrong pin: exit %d, stderr %q; want UNAVAILABLE naming the fingerprint", r.code, r.stderr)
	}

	// rotate-key, while discovery runs, changes the served keys within
	// seconds and keeps the previous one published.
	var rot struct {
		Previous             string     `json:"previous"`
		Active               string     `json:"active"`
		PreviousPublishUntil *time.Time `json:"previous_publish_until"`
	}
	out := mustRun(t, "discovery", "rotate-key", "--data", dir, "-o", "json")
	if err := json.Unmarshal([]byte(out), &rot); err != nil {
		t.Fatalf("rotate-key -o json printed %q: %v", out, err)
	}
	if rot.Previous != first || rot.Active == "" || rot.Active == first || rot.PreviousPublishUntil == nil ||
		rot.PreviousPublishUntil.Before(time.Now().Add(5*time.Minute)) {
		t.Fatalf("rotate-key = %+v, want a new key, %s published for minutes more", rot, first)
	}
	want := []string{first, rot.Active}
	slices.Sort(want)
	deadline := time.Now().Add(20 * time.Second)
	for got := servedKeys(t, p); !slices.Equal(got, want); got = servedKeys(t, p) {
		if time.Now().After(deadline) {
			t.Fatalf("served keys %v 20s after rotate-key, want %v", got, want)
		}
		time.Sleep(250 * time.Millisecond)
	}
	text = mustRun(t, "discovery", "rotate-key", "--data", dir)
	if !strings.Contains(text, "New ticket key:") || !strings.Contains(text, "Previous key:    "+rot.Active) {
		t.Errorf("rotate-key printed %q", text)
	}
	// --revoke-previous: the key it replaces leaves the JWKS at once.
	out = mustRun(t, "discovery", "rotate-key", "--data", dir, "--revoke-previous", "-o", "json")
	var rev struct {
		Previous string `json:"previous"`
		Active   string `json:"active"`
	}
	if err := json.Unmarshal([]byte(out), &rev); err != nil || rev.Previous == "" {
		t.Fatalf("rotate-key --revoke-previous -o json printed %q: %v", out, err)
	}
	deadline = time.Now().Add(20 * time.Second)
	for got := servedKeys(t, p); slices.Contains(got, rev.Previous) || !slices.Contains(got, rev.Active); got = servedKeys(t, p) {
		if time.Now().After(deadline) {
			t.Fatalf("served keys %v 20s after rotate-key --revoke-previous: %s still served or %s not", got, rev.Previous, rev.Active)
		}
		time.Sleep(250 * time.Millisecond)
	}

	// A restart keeps the identity and the keys.
	p.stop(t)
	before := showDiscovery(t, dir)
	p2 := startDiscovery(t, dir)
	if p2.fingerprint != p.fingerprint {
		t.Errorf("fingerprint after a restart %s, want %s", p2.fingerprint, p.fingerprint)
	}
	after := showDiscovery(t, dir)
	if after.Fingerprint != p.fingerprint || len(after.TicketKeys) != len(before.TicketKeys) || after.TicketKeys[0].ID != before.TicketKeys[0].ID {
		t.Errorf("after a restart show says %+v, before %+v", after, before)
	}
	if after.Issuer != "https://"+p2.addr {
		t.Errorf("issuer after a restart %q, want https://%s", after.Issuer, p2.addr)
	}
	if got := servedKeys(t, p2); !slices.Contains(got, before.TicketKeys[0].ID) {
		t.Errorf("served keys after a restart %v lack the active %s", got, before.TicketKeys[0].ID)
	}
}

func TestDiscoveryRefusals(t *testing.T) {
	t.Parallel()
	empty := filepath.Join(t.TempDir(), "none")
	for _, args := range [][]string{
		{"discovery", "show", "--data", empty},
		{"discovery", "rotate-key", "--data", empty},
		{"discovery", "show"},
		{"discovery", "lookup", "x-abcdef"},
		{"discovery", "--data", empty, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--key-rotation", "1s"},
	} {
		line := mustFail(t, args...)
		if strings.Contains(line, "\n") {
			t.Errorf("muster %v: %q", args, line)
		}
	}
	if _, err := os.Stat(empty); err == nil {
		t.Errorf("a refused command created %s", empty)
	}
	// Discovery refuses an authority's data directory.
	adir, _ := initDir(t)
	line := mustFail(t, "discovery", "--data", adir, "--listen", "127.0.0.1:0", "--metrics-listen", "")
	if !strings.Contains(line, "holds an authority") {
		t.Errorf("discovery in an authority's directory: %q", line)
	}
}

// TestDiscoveryLookupRegisteredAuthority runs an authority registered with
// discovery, and looks it up through the CLI.
func TestDiscoveryLookupRegisteredAuthority(t *testing.T) {
	t.Parallel()
	adir, init := initDir(t)
	d := startDiscovery(t, filepath.Join(t.TempDir(), "discovery"), allowing(init)...)
	startAuthority(t, adir, "--discovery", d.addr, "--discovery-fingerprint", d.fingerprint)
	id := init["authority_id"].(string)
	var res struct {
		AuthorityID   string          `json:"authority_id"`
		Endpoints     []string        `json:"endpoints"`
		CAFingerprint string          `json:"ca_fingerprint"`
		Version       int64           `json:"version"`
		Policy        json.RawMessage `json:"policy"`
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := muster(t, nil, "discovery", "lookup", id, "--discovery", d.addr, "--discovery-fingerprint", d.fingerprint, "-o", "json")
		if r.code == 0 {
			if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
				t.Fatalf("lookup -o json printed %q: %v", r.stdout, err)
			}
			break
		}
		if !strings.Contains(r.stderr, "NOT_FOUND") || time.Now().After(deadline) {
			t.Fatalf("lookup of a registered authority: %s\n%s", r.stderr, d.Logs())
		}
		time.Sleep(250 * time.Millisecond)
	}
	if res.AuthorityID != id || res.CAFingerprint != init["ca_fingerprint"] || res.Version < 1 || len(res.Endpoints) == 0 || !json.Valid(res.Policy) {
		t.Errorf("lookup = %+v", res)
	}
	text := mustRun(t, "discovery", "lookup", id, "--discovery", d.addr, "--discovery-fingerprint", d.fingerprint)
	for _, want := range []string{"Authority:    " + id, "CA:           " + res.CAFingerprint, "Policy:", "new_agents_per_day"} {
		if !strings.Contains(text, want) {
			t.Errorf("lookup printed\n%s\nwant it to contain %q", text, want)
		}
	}
}
