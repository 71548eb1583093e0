package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

type signerOut struct {
	VersionID string `json:"version_id"`
	PublicKey string `json:"public_key"`
	State     string `json:"state"`
	Previous  string `json:"previous"`
}

type signerList struct {
	Signers            []signerOut `json:"signers"`
	VerifierSetVersion int64       `json:"verifier_set_version"`
	MinLeadTime        string      `json:"min_lead_time"`
}

func listSigners(t *testing.T, dir string) (map[string]string, signerList) {
	t.Helper()
	var l signerList
	out := mustRun(t, "signer", "list", "--data", dir, "-o", "json")
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatalf("signer list -o json printed %q: %v", out, err)
	}
	m := map[string]string{}
	for _, s := range l.Signers {
		m[s.VersionID] = s.State
	}
	return m, l
}

// byNumber is a signer listing keyed by version number: a staged signer's
// ID is its number and its key's hash (v2-3fa9c2d1), the first one's v1.
func byNumber(m map[string]string) map[string]string {
	out := map[string]string{}
	for id, st := range m {
		num, _, _ := strings.Cut(id, "-")
		out[num] = st
	}
	return out
}

func wantSigners(t *testing.T, dir string, want map[string]string, version int64) {
	t.Helper()
	got, l := listSigners(t, dir)
	got = byNumber(got)
	if len(got) != len(want) || l.VerifierSetVersion != version {
		t.Fatalf("signers %v at version %d, want %v at %d", got, l.VerifierSetVersion, want, version)
	}
	for id, st := range want {
		if got[id] != st {
			t.Fatalf("signers %v, want %v", got, want)
		}
	}
}

// TestSignerLifecycle drives the signer commands through the binary: init
// creates the first signer; a rotation is staged, forced active, rolled
// back inside its grace and its signer revoked; refusals name the rule;
// every step is in the audit chain as node_task_signer.*.
func TestSignerLifecycle(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	startAuthority(t, dir)

	wantSigners(t, dir, map[string]string{"v1": "active"}, 1)
	if text := mustRun(t, "signer", "list", "--data", dir); !strings.Contains(text, "v1") || !strings.Contains(text, "active") || !strings.Contains(text, "minimum lead time 10m0s") {
		t.Errorf("signer list printed %q", text)
	}

	if msg := mustFail(t, "signer", "stage", "--data", dir, "--effective-in", "1m"); !strings.Contains(msg, "INVALID_ARGUMENT") || !strings.Contains(msg, "lead time") {
		t.Errorf("stage inside the lead time: %q", msg)
	}
	if msg := mustFail(t, "signer", "activate", "--data", dir); !strings.Contains(msg, "FAILED_PRECONDITION") {
		t.Errorf("activate with nothing staged: %q", msg)
	}
	if msg := mustFail(t, "signer", "rollback", "--data", dir); !strings.Contains(msg, "FAILED_PRECONDITION") {
		t.Errorf("rollback with no rotation: %q", msg)
	}

	mustRun(t, "signer", "stage", "--data", dir, "--effective-in", "15m", "--grace", "2h", "-o", "json")
	wantSigners(t, dir, map[string]string{"v1": "active", "v2": "staged"}, 2)
	// Revoking the active signer is an emergency rotation: the staged
	// signer takes its place in the same step.
	mustRun(t, "signer", "revoke", "--data", dir, "v1")
	wantSigners(t, dir, map[string]string{"v1": "revoked", "v2": "active"}, 3)

	mustRun(t, "signer", "stage", "--data", dir, "--effective-in", "15m", "--grace", "2h")
	mustRun(t, "signer", "activate", "--data", dir)
	wantSigners(t, dir, map[string]string{"v1": "revoked", "v2": "grace", "v3": "active"}, 5)
	mustRun(t, "signer", "rollback", "--data", dir)
	wantSigners(t, dir, map[string]string{"v1": "revoked", "v2": "active", "v3": "staged"}, 6)
	mustRun(t, "signer", "rollback", "--data", dir)
	wantSigners(t, dir, map[string]string{"v1": "revoked", "v2": "active", "v3": "retired"}, 7)
	if msg := mustFail(t, "signer", "revoke", "--data", dir, "Not-A-Version"); !strings.Contains(msg, "INVALID_ARGUMENT") {
		t.Errorf("revoke of a malformed version: %q", msg)
	}

	var records []struct {
		Action        string `json:"action"`
		Actor         string `json:"actor"`
		Target        string `json:"target"`
		Result        string `json:"result"`
		Reason        string `json:"reason"`
		CorrelationID string `json:"correlation_id"`
	}
	out := mustRun(t, "audit", "list", "--data", dir, "--action", "node_task_signer.*", "-o", "json")
	if err := json.Unmarshal([]byte(out), &records); err != nil {
		t.Fatalf("audit list printed %q: %v", out, err)
	}
	var got []string
	for _, r := range records {
		got = append(got, r.Action+"="+r.Result)
		if strings.HasPrefix(r.Actor, "spiffe://") == (r.CorrelationID == "") {
			t.Errorf("audit record without actor or correlation ID: %+v", r)
		}
	}
	want := "node_task_signer.create=ok node_task_signer.stage=denied node_task_signer.activate=denied node_task_signer.rollback=denied " +
		"node_task_signer.stage=ok node_task_signer.revoke=ok node_task_signer.stage=ok node_task_signer.activate=ok " +
		"node_task_signer.rollback=ok node_task_signer.rollback=ok node_task_signer.revoke=denied"
	if g := strings.Join(got, " "); g != want {
		t.Errorf("audit:\n got %s\nwant %s", g, want)
	}
	if r := records[4]; !strings.HasPrefix(r.Target, "v2-") || !strings.Contains(r.Reason, "previous=v1") || !strings.Contains(r.Reason, "effective_at=") || !strings.Contains(r.Reason, "grace_until=") {
		t.Errorf("stage record = %+v", r)
	}
}

// TestSignerCreatedOnUpgrade starts an authority on a store without
// signers, as one made before signers existed, and finds the first signer
// created at start; signer.min_lead_time from authority.yaml applies.
func TestSignerCreatedOnUpgrade(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	db := filepath.Join(dir, "muster.db")
	if out, err := exec.Command("sqlite3", db, "DELETE FROM signers; UPDATE signer_set SET version = 0;").CombinedOutput(); err != nil {
		t.Fatalf("sqlite3: %v\n%s", err, out)
	}
	if err := os.WriteFile(filepath.Join(dir, "authority.yaml"), []byte("signer:\n  min_lead_time: 2m\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	startAuthority(t, dir)
	_, l := listSigners(t, dir)
	if len(l.Signers) != 1 || l.Signers[0].VersionID != "v1" || l.Signers[0].State != "active" || l.MinLeadTime != "2m0s" {
		t.Fatalf("after upgrade: %+v", l)
	}
	mustRun(t, "signer", "stage", "--data", dir, "--effective-in", "3m")
	wantSigners(t, dir, map[string]string{"v1": "active", "v2": "staged"}, 2)
}

// TestSignerRefusalsNameTheWayOut: a signer step refused because the
// operator ran it out of order, or with times the rules refuse, says what
// to run instead, on the terminal and in the audit chain's reason.
func TestSignerRefusalsNameTheWayOut(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	startAuthority(t, dir)

	cases := []struct {
		args []string
		want string
	}{
		{[]string{"signer", "activate"}, "muster signer stage"},
		{[]string{"signer", "retire"}, "muster signer list"},
		{[]string{"signer", "revoke", "v9"}, "muster signer list"},
		{[]string{"signer", "stage", "--effective-in", "1m"}, "--effective-in 10m0s"},
		{[]string{"signer", "revoke", "v1"}, "`muster signer stage`"},
	}
	for _, c := range cases {
		if msg := mustFail(t, append(c.args, "--data", dir)...); !strings.Contains(msg, c.want) {
			t.Errorf("muster %s: %q names no %q", strings.Join(c.args, " "), msg, c.want)
		}
	}
	// A grace under 1s is refused before the authority is asked: nothing
	// is changed or recorded.
	if msg := mustFail(t, "signer", "stage", "--grace", "0s", "--data", dir); !strings.Contains(msg, "at least 1s (--grace 24h)") {
		t.Errorf("muster signer stage --grace 0s: %q names no 1s minimum and --grace 24h", msg)
	}
	var records []struct {
		Result string `json:"result"`
		Reason string `json:"reason"`
	}
	out := mustRun(t, "audit", "list", "--data", dir, "--action", "node_task_signer.*", "-o", "json")
	if err := json.Unmarshal([]byte(out), &records); err != nil {
		t.Fatalf("audit list printed %q: %v", out, err)
	}
	if len(records) != 1+len(cases) {
		t.Fatalf("%d signer records, want the creation and %d refusals", len(records), len(cases))
	}
	for i, c := range cases {
		if r := records[i+1]; r.Result != "denied" || !strings.Contains(r.Reason, c.want) {
			t.Errorf("audit of muster %s: %+v, want denied naming %q", strings.Join(c.args, " "), r, c.want)
		}
	}
}
