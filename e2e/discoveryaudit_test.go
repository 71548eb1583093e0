package e2e

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	_ "modernc.org/sqlite"
)

type discoveryAuditRecord struct {
	Seq    int64  `json:"seq"`
	Actor  string `json:"actor"`
	Action string `json:"action"`
	Target string `json:"target"`
	Result string `json:"result"`
	Reason string `json:"reason"`
	Source string `json:"source"`
	Hash   string `json:"hash"`
}

func discoveryAudit(t *testing.T, dir string, extra ...string) []discoveryAuditRecord {
	t.Helper()
	var recs []discoveryAuditRecord
	out := mustRun(t, append([]string{"discovery", "audit", "list", "--data", dir, "-o", "json"}, extra...)...)
	if err := json.Unmarshal([]byte(out), &recs); err != nil {
		t.Fatalf("discovery audit list -o json printed %q: %v", out, err)
	}
	return recs
}

// TestDiscoveryAudit reads and verifies discovery's own audit chain while
// discovery runs, then catches an edit made in its database.
func TestDiscoveryAudit(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "discovery")
	d := startDiscovery(t, dir)

	line := mustFail(t, "discovery", "lookup", "nobody-abcdef", "--discovery", d.addr, "--discovery-fingerprint", d.fingerprint)
	if !strings.Contains(line, "NOT_FOUND") {
		t.Fatalf("lookup of an unknown authority: %q", line)
	}

	recs := discoveryAudit(t, dir)
	var refusal *discoveryAuditRecord
	started := false
	for i, r := range recs {
		switch {
		case r.Action == "discovery.start" && r.Result == "ok":
			started = true
		case r.Action == "authority.lookup" && r.Target == "nobody-abcdef":
			refusal = &recs[i]
		}
	}
	if !started {
		t.Errorf("discovery audit list has no discovery.start record: %+v", recs)
	}
	if refusal == nil {
		t.Fatalf("discovery audit list has no refused lookup of nobody-abcdef: %+v", recs)
	}
	if refusal.Result != "denied" || refusal.Reason == "" || refusal.Source != "127.0.0.1" || refusal.Hash == "" {
		t.Errorf("refusal record %+v lacks result, reason, source or hash", refusal)
	}

	for _, r := range discoveryAudit(t, dir, "--action", "authority.*") {
		if !strings.HasPrefix(r.Action, "authority.") {
			t.Errorf("--action authority.* returned %s", r.Action)
		}
	}
	if got := discoveryAudit(t, dir, "--action", "discovery.start"); len(got) != 1 {
		t.Errorf("--action discovery.start returned %+v, want one record", got)
	}
	if got := discoveryAudit(t, dir, "--since", "2000-01-01T00:00:00Z", "--action", "authority.lookup"); len(got) != 1 || got[0].Seq != refusal.Seq {
		t.Errorf("--since and --action returned %+v, want the refusal", got)
	}
	if text := mustRun(t, "discovery", "audit", "list", "--data", dir); !strings.Contains(text, "SEQ") || !strings.Contains(text, "nobody-abcdef") {
		t.Errorf("discovery audit list printed\n%s", text)
	}

	if out := mustRun(t, "discovery", "audit", "verify", "--data", dir); !strings.Contains(out, "audit chain intact") {
		t.Errorf("discovery audit verify on an untouched chain printed %q", out)
	}
	var rep map[string]any
	json.Unmarshal([]byte(mustRun(t, "discovery", "audit", "verify", "--data", dir, "-o", "json")), &rep)
	if rep["ok"] != true {
		t.Errorf("discovery audit verify -o json: %v", rep)
	}

	// An attacker with write access to the database edits the refusal.
	db, err := sql.Open("sqlite", filepath.Join(dir, "discovery.db")+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	mustExec(t, db, `DROP TRIGGER IF EXISTS audit_records_no_update`)
	mustExec(t, db, `UPDATE audit_records SET reason = 'nothing to see' WHERE seq = ?`, refusal.Seq)

	want := fmt.Sprintf("record %d", refusal.Seq)
	if line := mustFail(t, "discovery", "audit", "verify", "--data", dir); !strings.Contains(line, "tampering detected at "+want) {
		t.Errorf("discovery audit verify of an edited chain said %q, want it to name %s", line, want)
	}
	r := muster(t, nil, "discovery", "audit", "verify", "--data", dir, "-o", "json")
	json.Unmarshal([]byte(r.stdout), &rep)
	if r.code == 0 || rep["ok"] != false || rep["first_bad_seq"] != float64(refusal.Seq) {
		t.Errorf("discovery audit verify -o json of an edited chain: exit %d, %v", r.code, rep)
	}
}

// TestDiscoveryRefusesACutChain: like the authority, discovery refuses to
// start on an audit chain shorter than its head file last saw (the newest
// records removed after a kill -9, or by whoever can write the store),
// rather than reuse their sequence numbers; audit verify names the cut.
func TestDiscoveryRefusesACutChain(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "discovery")
	d := startDiscovery(t, dir)
	for _, id := range []string{"nobody-aaaaaa", "nobody-bbbbbb", "nobody-cccccc"} {
		mustFail(t, "discovery", "lookup", id, "--discovery", d.addr, "--discovery-fingerprint", d.fingerprint)
	}
	d.cmd.Process.Kill()
	<-d.done

	db, err := sql.Open("sqlite", filepath.Join(dir, "discovery.db")+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	mustExec(t, db, `DROP TRIGGER IF EXISTS audit_records_no_delete`)
	mustExec(t, db, `DELETE FROM audit_records WHERE seq > (SELECT max(seq) - 2 FROM audit_records)`)

	if line := mustFail(t, "discovery", "audit", "verify", "--data", dir); !strings.Contains(line, "removed from the tail") {
		t.Errorf("discovery audit verify said %q, want the cut tail named", line)
	}
	r := muster(t, nil, "discovery", "--data", dir, "--listen", "127.0.0.1:0", "--metrics-listen", "")
	if r.code == 0 || !strings.Contains(r.stderr, "removed from the tail") || !strings.Contains(r.stderr, "head file") {
		t.Fatalf("discovery restarted on the cut chain: exit %d, %s", r.code, r.stderr)
	}
}
