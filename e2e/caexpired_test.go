package e2e

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestAuthorityBackAfterItsServerIntermediateExpired: an authority stopped
// for longer than its active server intermediate had left (here a
// 2-minute one, activated by hand; in a fleet, an authority shelved for
// months, or one started on a store restored from an old backup) cannot
// issue its listener certificate, and the leader's clock that would
// replace the intermediate runs only in a started authority. Its refusal
// to start names muster ca rotate server --offline --data DIR, which,
// pasted, makes a new server intermediate under the root (the key of an
// expired one still opens: that used to be refused, "it is not lost",
// a dead end); the refusal is audited; the authority then starts and an
// agent joins and renews through it. About two and a half minutes, mostly idle.
func TestAuthorityBackAfterItsServerIntermediateExpired(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t, "--ca-intermediate-ttl", "2m")
	caRotate(t, e.dir, "server")
	var act struct {
		Intermediate struct {
			Serial   string    `json:"serial"`
			NotAfter time.Time `json:"not_after"`
		} `json:"intermediate"`
	}
	if !pollFor(30*time.Second, func() bool {
		r := muster(t, nil, "ca", "rotate", "server", "--activate", "--data", e.dir, "-o", "json")
		return r.code == 0 && json.Unmarshal([]byte(r.stdout), &act) == nil
	}) || act.Intermediate.NotAfter.IsZero() {
		t.Fatal("ca rotate server --activate did not succeed within 30 s of preparing")
	}
	e.auth.stop(t)
	// The authority is away past the intermediate's not-after.
	time.Sleep(time.Until(act.Intermediate.NotAfter) + 2*time.Second)

	r := muster(t, nil, "authority", "--data", e.dir, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--ca-intermediate-ttl", "2m", "--log-format", "json")
	if r.code == 0 {
		t.Fatal("the authority started with an expired server intermediate")
	}
	wayOut := "muster ca rotate server --offline --data " + e.dir
	for _, want := range []string{act.Intermediate.Serial + ") has expired", wayOut} {
		if !strings.Contains(r.stderr, want) {
			t.Fatalf("the refusal to start does not say %q:\n%s", want, r.stderr)
		}
	}
	if rot := pastedCommand(t, r.stderr, wayOut, " ("); rot.code != 0 {
		t.Fatalf("%s, pasted: exit %d\n%s%s", wayOut, rot.code, rot.stdout, rot.stderr)
	} else if !strings.Contains(rot.stdout, "Activated the server intermediate") || !strings.Contains(rot.stdout, act.Intermediate.Serial+", is retiring") {
		t.Errorf("%s printed:\n%s", wayOut, rot.stdout)
	}

	e.auth = startAuthority(t, e.dir, "--ca-intermediate-ttl", "2m")
	tok := e.createToken(t)
	adir := filepath.Join(t.TempDir(), "back")
	if j := muster(t, nil, "agent", "join", "--data", adir, "--node", "back", tok.URI); j.code != 0 {
		t.Fatalf("agent join after the offline rotation: exit %d\n%s", j.code, j.stderr)
	}
	mustRun(t, "agent", "renew", "--data", adir)
	var recs []struct{ Actor, Action, Result, Reason string }
	if err := json.Unmarshal([]byte(mustRun(t, "audit", "list", "--data", e.dir, "--action", "ca.activate", "-o", "json")), &recs); err != nil {
		t.Fatal(err)
	}
	if n := len(recs); n == 0 || recs[n-1].Actor != "muster ca rotate --offline" || !strings.Contains(recs[n-1].Reason, "which expired at") {
		t.Errorf("the offline activation's audit record: %+v", recs)
	}
	recs = nil
	if err := json.Unmarshal([]byte(mustRun(t, "audit", "list", "--data", e.dir, "--action", "authority.start", "-o", "json")), &recs); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(recs, func(r struct{ Actor, Action, Result, Reason string }) bool {
		return r.Result == "denied" && strings.Contains(r.Reason, wayOut)
	}) {
		t.Errorf("no authority.start record denied naming %q: %+v", wayOut, recs)
	}
}
