package e2e

import (
	"crypto/x509"
	"database/sql"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/muster-dev/muster/internal/ca"
)

// joinAgentChain joins a new agent through addr and returns its chain (leaf,
// intermediate).
func joinAgentChain(t *testing.T, e *agentEnv, addr, node string) []*x509.Certificate {
	t.Helper()
	adir := filepath.Join(t.TempDir(), node)
	tok := e.createToken(t, "--uses", "1")
	if r := muster(t, []string{"MUSTER_JOIN_TOKEN=" + tok.Token}, "agent", "join", "--data", adir, "--node", node,
		"--authority", addr, "--ca-fingerprint", e.fingerprint); r.code != 0 {
		t.Fatalf("agent join through %s: %s", addr, r.stderr)
	}
	return readCerts(t, filepath.Join(adir, "certs", "agent.crt"))
}

// rotateJSON is what ca rotate -o json prints.
type rotateJSON struct {
	Intermediate struct {
		Role, Serial, State string
	} `json:"intermediate"`
	Previous *struct {
		Serial, State string
	} `json:"previous"`
}

func caRotate(t *testing.T, dir string, args ...string) rotateJSON {
	t.Helper()
	var r rotateJSON
	out := mustRun(t, append([]string{"ca", "rotate", "--data", dir, "-o", "json"}, args...)...)
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.Intermediate.Serial == "" {
		t.Fatalf("ca rotate -o json printed %q: %v", out, err)
	}
	return r
}

func httpGet(t *testing.T, url string) (int, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// pollFor polls cond every 200 ms for up to d; false if it never held.
func pollFor(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); ; time.Sleep(200 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}

// TestCARotateOfflineRoot: an authority whose root key was taken out of
// the data directory warns (log, muster status, metric) that the agent
// intermediate's successor is due within 60 days and names the command;
// muster ca rotate agent --root-key FILE prepares it with the key from
// the file, which never reaches the authority; its (empty) revocation
// list is served before it signs anything; --activate refuses until every
// replica has had the publish window, then activates; the next agent's
// leaf chains to it and names a list that is served. Refusals are
// audited with their reasons. It runs beside other tests: a replica reads
// a CA step within about a second of its notification (caPublishWindow),
// and every window here is 5 s or more.
func TestCARotateOfflineRoot(t *testing.T) {
	t.Parallel()
	dir, out := initDir(t)
	fp, _ := out["ca_fingerprint"].(string)
	// The root key goes offline (a USB stick).
	rootKey := filepath.Join(t.TempDir(), "root.key")
	if err := os.Rename(filepath.Join(dir, "ca", "root.key"), rootKey); err != nil {
		t.Fatal(err)
	}
	crlAddr := freePort(t)
	// A 100-day intermediate life: init's year-long intermediates are
	// due a successor at 50 days, within the 60-day warning; the leader
	// would activate at 66 days, so nothing here is its doing.
	e := &agentEnv{dir: dir, fingerprint: fp, auth: startAuthority(t, dir, "--ca-intermediate-ttl", "2400h",
		"--crl-listen", crlAddr, "--crl-url", "http://"+crlAddr)}

	// Warned: in the log (the leader's), muster status, the metric.
	if !pollFor(10*time.Second, func() bool { return strings.Contains(e.auth.Logs(), "muster ca rotate agent --root-key FILE") }) {
		t.Fatalf("no offline-root warning logged:\n%s", e.auth.Logs())
	}
	time.Sleep(6 * time.Second) // another tick of the leader's CA clock
	if n := len(regexp.MustCompile(`"level":"WARN","msg":"a CA intermediate needs a successor[^\n]*"role":"agent"`).FindAllString(e.auth.Logs(), -1)); n != 1 {
		t.Errorf("the agent role was warned %d times, want once a day:\n%s", n, e.auth.Logs())
	}
	st := mustRun(t, "status", "--data", dir)
	if !strings.Contains(st, "Warning:         the agent intermediate") || !strings.Contains(st, "muster ca rotate agent --root-key FILE") {
		t.Fatalf("muster status does not warn of the agent intermediate:\n%s", st)
	}
	if m := metricsOf(t, e.auth.metrics); !strings.Contains(m, `muster_ca_rotation_blocked{role="agent"} 1`) {
		t.Fatalf("muster_ca_rotation_blocked{role=\"agent\"} is not 1:\n%s", grepLines(m, "muster_ca_"))
	}

	// Refusals name the way out.
	if line := mustFail(t, "ca", "rotate", "agent", "--data", dir); !strings.Contains(line, "FAILED_PRECONDITION") || !strings.Contains(line, "muster ca rotate agent --root-key FILE") {
		t.Errorf("ca rotate without the root key: %s", line)
	}
	if line := mustFail(t, "ca", "rotate", "agent", "--activate", "--data", dir); !strings.Contains(line, "no prepared successor") || !strings.Contains(line, "muster ca rotate agent") {
		t.Errorf("ca rotate --activate with nothing prepared: %s", line)
	}
	if line := mustFail(t, "ca", "rotate", "policy", "--data", dir); !strings.Contains(line, "INVALID_ARGUMENT") {
		t.Errorf("ca rotate policy: %s", line)
	}
	os.Chmod(rootKey, 0o644)
	if line := mustFail(t, "ca", "rotate", "agent", "--root-key", rootKey, "--data", dir); !strings.Contains(line, "chmod 600") {
		t.Errorf("ca rotate with a world-readable root key: %s", line)
	}
	os.Chmod(rootKey, 0o600)
	// Another authority's root key signs nothing here.
	otherDir, _ := initDir(t)
	if line := mustFail(t, "ca", "rotate", "agent", "--root-key", filepath.Join(otherDir, "ca", "root.key"), "--data", dir); !strings.Contains(line, "is not this authority's root key") {
		t.Errorf("ca rotate with another root key: %s", line)
	}

	prep := caRotate(t, dir, "agent", "--root-key", rootKey)
	prepared := time.Now()
	serial := prep.Intermediate.Serial
	if prep.Intermediate.State != "prepared" {
		t.Fatalf("ca rotate --root-key: %+v", prep)
	}
	if _, err := os.Stat(filepath.Join(dir, "ca", "root.key")); !os.IsNotExist(err) {
		t.Fatalf("the root key is in the data directory: %v", err)
	}
	// A second prepare while one is prepared is refused, naming it.
	if line := mustFail(t, "ca", "rotate", "agent", "--root-key", rootKey, "--data", dir); !strings.Contains(line, "already has a prepared successor (serial "+serial) {
		t.Errorf("a second prepare: %s", line)
	}
	// Its list is served before it signs anything.
	url := "http://" + crlAddr + "/crl/agent-" + serial + ".crl"
	var der []byte
	if !pollFor(5*time.Second, func() bool {
		var code int
		code, der = httpGet(t, url)
		return code == http.StatusOK
	}) {
		t.Fatalf("GET %s of the prepared intermediate is not served within 5 s: %s", url, der)
	}
	rl, err := x509.ParseRevocationList(der)
	if err != nil || len(rl.RevokedCertificateEntries) != 0 {
		t.Fatalf("the prepared intermediate's list: %v, %d entries", err, len(rl.RevokedCertificateEntries))
	}
	// Warned no more for the agent intermediate.
	if !pollFor(5*time.Second, func() bool {
		return strings.Contains(metricsOf(t, e.auth.metrics), `muster_ca_rotation_blocked{role="agent"} 0`)
	}) {
		t.Error("muster_ca_rotation_blocked{role=\"agent\"} stays 1 with a successor prepared")
	}
	if st := mustRun(t, "status", "--data", dir); strings.Contains(st, "the agent intermediate") {
		t.Errorf("muster status still warns of the agent intermediate:\n%s", st)
	}

	// Activation waits for the publish window.
	if line := mustFail(t, "ca", "rotate", "agent", "--activate", "--data", dir); time.Since(prepared) < 9*time.Second &&
		(!strings.Contains(line, "not published by every replica yet") || !strings.Contains(line, "muster ca rotate agent --activate")) {
		t.Errorf("activation right after preparing: %s", line)
	}
	var act rotateJSON
	if !pollFor(20*time.Second, func() bool {
		r := muster(t, nil, "ca", "rotate", "agent", "--activate", "--data", dir, "-o", "json")
		return r.code == 0 && json.Unmarshal([]byte(r.stdout), &act) == nil
	}) {
		t.Fatal("ca rotate agent --activate did not succeed within 20 s of preparing")
	}
	if act.Intermediate.Serial != serial || act.Intermediate.State != "active" || act.Previous == nil || act.Previous.State != "retiring" {
		t.Fatalf("ca rotate --activate: %+v", act)
	}

	// The next agent's leaf chains to it, names its list, and the list
	// is served and signed by it.
	certs := joinAgentChain(t, e, e.auth.addr, "after-rotate")
	if got := certs[1].SerialNumber.Text(16); got != serial {
		t.Fatalf("a leaf after activation is issued by %s, want %s", got, serial)
	}
	if len(certs[0].CRLDistributionPoints) != 1 || certs[0].CRLDistributionPoints[0] != url {
		t.Fatalf("the leaf names %v, want %s", certs[0].CRLDistributionPoints, url)
	}
	fetchCRL(t, url, certs[1])
	verifyLeaf(t, filepath.Join(dir, "ca", "root.crt"), certs)

	// Audited: the prepare and activation by the operator, and refusals
	// with their reasons.
	var recs []struct{ Actor, Action, Target, Result, Reason string }
	json.Unmarshal([]byte(mustRun(t, "audit", "list", "--data", dir, "--action", "ca.*", "-o", "json")), &recs)
	var seen []string
	for _, r := range recs {
		seen = append(seen, r.Action+" "+r.Target+" "+r.Result)
		if r.Reason == "" && r.Actor != "authority" {
			t.Errorf("an operator's CA step audited without a reason: %+v", r)
		}
	}
	all := strings.Join(seen, "\n")
	for _, want := range []string{"ca.prepare agent/" + serial + " ok", "ca.activate agent/" + serial + " ok", "ca.prepare agent denied", "ca.activate agent denied"} {
		if !strings.Contains(all, want) {
			t.Errorf("audit has no %q:\n%s", want, all)
		}
	}
}

// verifyLeaf runs openssl verify on a leaf and its intermediate against
// root.
func verifyLeaf(t *testing.T, root string, certs []*x509.Certificate) {
	t.Helper()
	tmp := t.TempDir()
	leaf, inter := filepath.Join(tmp, "leaf.pem"), filepath.Join(tmp, "inter.pem")
	os.WriteFile(leaf, ca.EncodeCertPEM(certs[0]), 0o644)
	os.WriteFile(inter, ca.EncodeCertPEM(certs[1]), 0o644)
	out, err := exec.Command("openssl", "verify", "-CAfile", root, "-untrusted", inter, "-purpose", "sslclient", leaf).CombinedOutput()
	if err != nil || !strings.Contains(string(out), ": OK") {
		t.Fatalf("openssl verify: %v\n%s", err, out)
	}
}

// TestReadyzWhenIntermediatesCannotBeRead: a CA intermediate in the store
// whose key does not open (here a prepared row written behind the
// authority's back with a broken key reference) makes the next read of
// the intermediates fail: /readyz answers 503 with the reason, the
// failure is logged once however often the read is tried again, and once
// the row is gone the replica is ready again by itself.
func TestReadyzWhenIntermediatesCannotBeRead(t *testing.T) {
	e := newAgentEnv(t)
	ready := "http://" + e.auth.metrics + "/readyz"
	if code, body := httpGet(t, ready); code != http.StatusOK {
		t.Fatalf("GET /readyz at start: %d %s", code, body)
	}
	// A server successor signed by the root, its key reference broken.
	h, err := ca.Load(filepath.Join(e.dir, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := ca.NewSerial()
	pubKey, _ := ca.Create("other", time.Now())
	cert, err := h.NewIntermediate(ca.RoleServer, serial, pubKey.Issuers[ca.RoleServer].Cert.PublicKey, h.RootKey, time.Now(), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", filepath.Join(e.dir, "muster.db")+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`INSERT INTO ca_certs (serial, role, cert_der, key_ref, state, not_after, created_at) VALUES (?, 'server', ?, ?, 'prepared', ?, ?)`,
		serial.Text(16), cert.Raw, []byte("not a sealed key"), cert.NotAfter.UnixMicro(), time.Now().UnixMicro()); err != nil {
		t.Fatal(err)
	}
	// Written behind the authority's back, the row announces no change:
	// the replica's periodic read (every 3 s) finds it.
	var body []byte
	if !pollFor(5*time.Second, func() bool {
		var code int
		code, body = httpGet(t, ready)
		return code == http.StatusServiceUnavailable
	}) {
		t.Fatalf("GET /readyz stays ready with an intermediate whose key does not open: %s", body)
	}
	if !strings.Contains(string(body), "not ready: the CA intermediates in the store cannot be read") || !strings.Contains(string(body), serial.Text(16)) {
		t.Errorf("GET /readyz does not say why: %s", body)
	}
	time.Sleep(7 * time.Second) // two more reads
	if n := strings.Count(e.auth.Logs(), "reading the CA intermediates from the store failed"); n != 1 {
		t.Errorf("the failure was logged %d times over three reads, want once:\n%s", n, e.auth.Logs())
	}
	if _, err := db.Exec(`DELETE FROM ca_certs WHERE serial = ?`, serial.Text(16)); err != nil {
		t.Fatal(err)
	}
	if !pollFor(10*time.Second, func() bool { code, _ := httpGet(t, ready); return code == http.StatusOK }) {
		t.Fatal("GET /readyz not ready 10 s after the broken row was removed")
	}
	// /readyz turns ready as the failure is cleared, just before the
	// recovery is logged and the log line crosses the pipe.
	if !pollFor(5*time.Second, func() bool {
		return regexp.MustCompile(`read the CA intermediates from the store again`).MatchString(e.auth.Logs())
	}) {
		t.Error("the recovery is not logged")
	}
}

// TestCARotateTwoReplicasPostgres: two replicas on one PostgreSQL. The
// agent intermediate's successor is prepared through replica A; a second
// prepare through B is refused, naming it; activation through A waits for
// the publish window; then leaves issued by replica B chain to the new
// intermediate within seconds, and openssl checks them against the root.
// It runs beside other tests: B reads the activation within about a second
// of its notification (caPublishWindow), five times less than it is given.
func TestCARotateTwoReplicasPostgres(t *testing.T) {
	t.Parallel()
	_, rs := startReplicas(t, 2)
	a, b := rs[0], rs[1]
	prep := caRotate(t, a.dir, "agent")
	serial := prep.Intermediate.Serial
	if line := mustFail(t, "ca", "rotate", "agent", "--data", b.dir); !strings.Contains(line, "already has a prepared successor (serial "+serial) {
		t.Errorf("a second prepare through replica B: %s", line)
	}
	// Before activation B still signs with the first one.
	if got := joinAgentChain(t, b, b.auth.addr, "before")[1].SerialNumber.Text(16); got == serial {
		t.Fatal("replica B signs with the prepared intermediate before its activation")
	}
	var act rotateJSON
	if !pollFor(20*time.Second, func() bool {
		r := muster(t, nil, "ca", "rotate", "agent", "--activate", "--data", a.dir, "-o", "json")
		if r.code != 0 && !strings.Contains(r.stderr, "not published by every replica yet") {
			t.Fatalf("ca rotate --activate through A: %s", r.stderr)
		}
		return r.code == 0 && json.Unmarshal([]byte(r.stdout), &act) == nil
	}) {
		t.Fatal("ca rotate agent --activate through A did not succeed within 20 s")
	}
	activated := time.Now()
	var certs []*x509.Certificate
	for i := 0; ; i++ {
		certs = joinAgentChain(t, b, b.auth.addr, "after-"+strconv.Itoa(i))
		if certs[1].SerialNumber.Text(16) == serial {
			break
		}
		if time.Since(activated) > 5*time.Second {
			t.Fatalf("replica B still issues from %s 5 s after activation through A, want %s", certs[1].SerialNumber.Text(16), serial)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("replica B issued from the new intermediate %s after activation through A", time.Since(activated).Round(10*time.Millisecond))
	verifyLeaf(t, filepath.Join(b.dir, "ca", "root.crt"), certs)
	// Both replicas record one activation between them.
	var recs []struct{ Action, Target, Result string }
	json.Unmarshal([]byte(mustRun(t, "audit", "list", "--data", b.dir, "--action", "ca.activate", "-o", "json")), &recs)
	n := 0
	for _, r := range recs {
		if r.Target == "agent/"+serial && r.Result == "ok" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d successful activations of agent/%s audited, want 1: %+v", n, serial, recs)
	}
}
