package e2e

import (
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// TestOperatorStepsTakenOnceAcrossReplicas: two operators (or one retrying
// through the other replica) who saw the same state take the same step
// through two replicas on one PostgreSQL at once: a signer rollback, a
// root rotation's next-phase, a PSK rotation with --grace 0s. Each
// happens once: exactly one call succeeds, the other fails ABORTED,
// naming the command to look again with, and the state is the one step's.
// Without the seen value the second call would re-read and take another
// step (discard the signer put back to staged, advance a second phase,
// revoke the first rotation's new PSK).
func TestOperatorStepsTakenOnceAcrossReplicas(t *testing.T) {
	t.Parallel()
	_, rs := startReplicas(t, 2)
	at := func(i int, args ...string) []string {
		return append(args, "--data", rs[i].dir, "--authority", rs[i].auth.addr)
	}
	// both runs args through replica 0 and replica 1 at once and wants
	// one success and one ABORTED naming hint.
	both := func(what, hint string, args ...string) string {
		t.Helper()
		var res [2]result
		var wg sync.WaitGroup
		for i := range res {
			wg.Go(func() { res[i] = muster(t, nil, at(i, args...)...) })
		}
		wg.Wait()
		var ok, aborted int
		out := ""
		for _, r := range res {
			switch {
			case r.code == 0:
				ok++
				out = r.stdout
			case strings.Contains(r.stderr, "ABORTED") && strings.Contains(r.stderr, hint):
				aborted++
			}
		}
		if ok != 1 || aborted != 1 {
			t.Fatalf("%s through both replicas: %d succeeded, %d ABORTED naming %q; want one each\nA: %+v\nB: %+v", what, ok, aborted, hint, res[0], res[1])
		}
		return out
	}

	// Signer rollback: both saw v2 active, v1 in grace.
	mustRun(t, at(0, "signer", "stage", "--effective-in", "30m")...)
	mustRun(t, at(0, "signer", "activate")...)
	m, l := listSigners(t, rs[0].dir)
	var v2 string
	for id, st := range m {
		if st == "active" {
			v2 = id
		}
	}
	both("signer rollback", "muster signer list", "signer", "rollback", v2, "--verifier-set-version", strconv.FormatInt(l.VerifierSetVersion, 10))
	if got := byNumber(m1(listSigners(t, rs[1].dir))); got["v1"] != "active" || got["v2"] != "staged" {
		t.Fatalf("signers after one rollback: %v; want v1 active and v2 staged again", got)
	}

	// Signer retire on a stale listing: the operator saw v1 active (the
	// set at l2); another activated v2 since, which put v1 in grace. A
	// retire asked on what they saw is refused, and v1 stays in grace.
	_, l2 := listSigners(t, rs[0].dir)
	mustRun(t, at(1, "signer", "activate")...)
	r := muster(t, nil, at(0, "signer", "retire", "v1", "--verifier-set-version", strconv.FormatInt(l2.VerifierSetVersion, 10))...)
	if r.code == 0 || !strings.Contains(r.stderr, "ABORTED") || !strings.Contains(r.stderr, "muster signer list") {
		t.Fatalf("signer retire on a stale listing: %+v; want ABORTED naming muster signer list", r)
	}
	if got := byNumber(m1(listSigners(t, rs[1].dir))); got["v1"] != "grace" || got["v2"] != "active" {
		t.Fatalf("signers after a refused retire: %v; want v1 in grace and v2 active", got)
	}

	// Signer revoke on a stale listing: the operator saw v2 active and v3
	// staged; another rolled v3 back and staged v4 since. Revoking v2 now
	// would activate v4, which they never saw: refused, nothing moves.
	mustRun(t, at(0, "signer", "stage", "--effective-in", "30m")...)
	_, l3 := listSigners(t, rs[0].dir)
	mustRun(t, at(1, "signer", "rollback")...)
	mustRun(t, at(1, "signer", "stage", "--effective-in", "30m")...)
	r = muster(t, nil, at(0, "signer", "revoke", v2, "--verifier-set-version", strconv.FormatInt(l3.VerifierSetVersion, 10))...)
	if r.code == 0 || !strings.Contains(r.stderr, "ABORTED") || !strings.Contains(r.stderr, "muster signer list") || !strings.Contains(r.stderr, "muster signer revoke "+v2) {
		t.Fatalf("signer revoke on a stale listing: %+v; want ABORTED naming muster signer list and muster signer revoke %s", r, v2)
	}
	if got := byNumber(m1(listSigners(t, rs[1].dir))); got["v2"] != "active" || got["v4"] != "staged" {
		t.Fatalf("signers after a refused revoke: %v; want v2 active and v4 staged", got)
	}
	// Revoked on a fresh listing (the CLI reads it), v4 takes over.
	mustRun(t, at(0, "signer", "revoke", v2)...)
	if got := byNumber(m1(listSigners(t, rs[1].dir))); got["v2"] != "revoked" || got["v4"] != "active" {
		t.Fatalf("signers after the revoke: %v; want v2 revoked and v4 active", got)
	}

	// Root next-phase: both saw phase init.
	mustRun(t, at(1, "ca", "root", "rotate")...)
	both("ca root next-phase", "muster ca root status", "ca", "root", "next-phase", "--from", "init")
	var st struct {
		Phase string `json:"phase"`
	}
	if out := mustRun(t, at(0, "ca", "root", "status", "-o", "json")...); json.Unmarshal([]byte(out), &st) != nil || st.Phase != "update_agents" {
		t.Fatalf("root rotation after one next-phase: %q; want phase update_agents", out)
	}

	// PSK rotation with no grace: both saw the same active PSK.
	from := showPSKs(t, rs[0].dir).Active.ID
	var rot pskRotate
	out := both("psk rotate --grace 0s", "muster psk show", "psk", "rotate", "--grace", "0s", "--from", from, "-o", "json")
	if err := json.Unmarshal([]byte(out), &rot); err != nil || rot.Active == nil {
		t.Fatalf("psk rotate -o json printed %q: %v", out, err)
	}
	if now := showPSKs(t, rs[1].dir); now.Active.ID != rot.Active.ID || now.Grace != nil {
		t.Fatalf("PSKs after one rotation: active %s, grace %v; want %s alone (the rotation that succeeded)", now.Active.ID, now.Grace, rot.Active.ID)
	}
}

// m1 is the first of two results.
func m1[A, B any](a A, _ B) A { return a }
