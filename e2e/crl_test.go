package e2e

import (
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/ca"
)

// fetchCRL gets a list over HTTP and parses it as a relying party would.
// crlClient bounds every fetch, so a server that stops answering fails the
// test at the fetch instead of hanging it until the package's timeout.
var crlClient = &http.Client{Timeout: time.Minute}

func fetchCRL(t *testing.T, url string, issuer *x509.Certificate) (*x509.RevocationList, []byte) {
	t.Helper()
	resp, err := crlClient.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	der, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/pkix-crl" {
		t.Fatalf("GET %s: %s %q: %s", url, resp.Status, resp.Header.Get("Content-Type"), der)
	}
	rl, err := x509.ParseRevocationList(der)
	if err != nil {
		t.Fatalf("x509.ParseRevocationList: %v", err)
	}
	if err := rl.CheckSignatureFrom(issuer); err != nil {
		t.Fatalf("the list is not signed by its intermediate: %v", err)
	}
	return rl, der
}

// opensslVerify runs openssl verify -crl_check on an agent's certificate
// with the list at url fetched now; nil if openssl accepts it.
func opensslVerify(t *testing.T, adir, url string, issuer *x509.Certificate) error {
	t.Helper()
	_, der := fetchCRL(t, url, issuer)
	tmp := t.TempDir()
	crlFile, leafFile, interFile := filepath.Join(tmp, "crl.pem"), filepath.Join(tmp, "leaf.pem"), filepath.Join(tmp, "inter.pem")
	os.WriteFile(crlFile, pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: der}), 0o644)
	certs := readCerts(t, filepath.Join(adir, "certs", "agent.crt"))
	os.WriteFile(leafFile, ca.EncodeCertPEM(certs[0]), 0o644)
	os.WriteFile(interFile, ca.EncodeCertPEM(certs[1]), 0o644)
	out, err := exec.Command("openssl", "verify", "-crl_check", "-CRLfile", crlFile,
		"-CAfile", filepath.Join(adir, "certs", "ca.crt"), "-untrusted", interFile, leafFile).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	return nil
}

func readCerts(t *testing.T, path string) []*x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	certs, err := ca.ParseCertsPEM(data)
	if err != nil || len(certs) < 2 {
		t.Fatalf("%s: %v", path, err)
	}
	return certs
}

// TestCRL: each issuing intermediate's list is served over HTTP at the
// URL every new leaf names; openssl verify -crl_check refuses a locked
// node's certificate within 5 s of the lock and accepts it again once
// the unlock's list is out; a deleted node's certificate is listed too;
// the lists are signed again at half their validity, and their age and
// size are exported. The lists live 10 s (the least --crl-validity
// takes), so the regular signing comes 5 s after the last change. It runs
// beside other tests: a lock reaches the list within about a second
// (docs/crl.md), five times less than the 5 s it is given.
func TestCRL(t *testing.T) {
	t.Parallel()
	crlAddr := freePort(t)
	base := "http://" + crlAddr
	e := newAgentEnv(t, "--crl-listen", crlAddr, "--crl-url", base, "--crl-validity", "10s")
	join := func(node string) string {
		adir := filepath.Join(t.TempDir(), node)
		tok := e.createToken(t, "--uses", "1")
		if r := muster(t, []string{"MUSTER_JOIN_TOKEN=" + tok.Token}, "agent", "join", "--data", adir, "--node", node,
			"--authority", e.auth.addr); r.code != 0 {
			t.Fatalf("agent join %s: %s", node, r.stderr)
		}
		return adir
	}
	a1, a2 := join("n1"), join("n2")
	certs := readCerts(t, filepath.Join(a1, "certs", "agent.crt"))
	leaf, inter := certs[0], certs[1]
	url := base + "/crl/agent-" + inter.SerialNumber.Text(16) + ".crl"
	if len(leaf.CRLDistributionPoints) != 1 || leaf.CRLDistributionPoints[0] != url {
		t.Fatalf("the agent's certificate names %v as its CRL Distribution Points, want %s", leaf.CRLDistributionPoints, url)
	}
	if err := opensslVerify(t, a1, url, inter); err != nil {
		t.Fatalf("openssl verify -crl_check before any lock: %v", err)
	}
	rl, _ := fetchCRL(t, url, inter)
	if len(rl.RevokedCertificateEntries) != 0 || rl.Number.Sign() <= 0 {
		t.Fatalf("a fresh list holds %d entries, number %v", len(rl.RevokedCertificateEntries), rl.Number)
	}

	// A lock: refused within 5 s.
	mustRun(t, "lock", "create", "--node", "n1", "--reason", "stolen", "--data", e.dir)
	locked := time.Now()
	var err error
	for err = opensslVerify(t, a1, url, inter); err == nil && time.Since(locked) < 5*time.Second; err = opensslVerify(t, a1, url, inter) {
		time.Sleep(200 * time.Millisecond)
	}
	if err == nil || !strings.Contains(err.Error(), "certificate revoked") {
		t.Fatalf("openssl verify -crl_check 5 s after the lock: %v", err)
	}
	t.Logf("refused %v after the lock", time.Since(locked).Round(10*time.Millisecond))
	if err := opensslVerify(t, a2, url, inter); err != nil {
		t.Errorf("another node's certificate is refused: %v", err)
	}
	rl, _ = fetchCRL(t, url, inter)
	if len(rl.RevokedCertificateEntries) != 1 || rl.RevokedCertificateEntries[0].SerialNumber.Cmp(leaf.SerialNumber) != 0 ||
		rl.RevokedCertificateEntries[0].ReasonCode != 6 {
		t.Fatalf("the list after the lock: %+v", rl.RevokedCertificateEntries)
	}

	// The unlock: accepted again with the next list.
	var locks []map[string]any
	json.Unmarshal([]byte(mustRun(t, "lock", "list", "--data", e.dir, "-o", "json")), &locks)
	mustRun(t, "lock", "delete", locks[0]["id"].(string), "--data", e.dir)
	unlocked := time.Now()
	for err = opensslVerify(t, a1, url, inter); err != nil && time.Since(unlocked) < 15*time.Second; err = opensslVerify(t, a1, url, inter) {
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("openssl verify -crl_check after the unlock: %v", err)
	}

	// A deletion: n2's certificate is listed.
	mustRun(t, "agents", "delete", "n2", "--data", e.dir)
	deleted := time.Now()
	for err = opensslVerify(t, a2, url, inter); err == nil && time.Since(deleted) < 5*time.Second; err = opensslVerify(t, a2, url, inter) {
		time.Sleep(200 * time.Millisecond)
	}
	if err == nil || !strings.Contains(err.Error(), "certificate revoked") {
		t.Fatalf("openssl verify -crl_check 5 s after the deletion: %v", err)
	}

	// Half the validity: signed again though nothing changed.
	rl, _ = fetchCRL(t, url, inter)
	before := rl.Number.Int64()
	deadline := time.Now().Add(15 * time.Second)
	for rl.Number.Int64() == before && time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond)
		rl, _ = fetchCRL(t, url, inter)
	}
	if rl.Number.Int64() <= before || len(rl.RevokedCertificateEntries) != 1 {
		t.Errorf("after half its validity: number %v (was %d), %d entries", rl.Number, before, len(rl.RevokedCertificateEntries))
	}

	// Every issuing intermediate has its list; nothing else is served.
	resp, err := crlClient.Get(base + "/crl/agent-00.crl")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("an unknown list: %s", resp.Status)
	}
	// Operators: a break-glass identity names the admin intermediate's
	// list (crl_url from the environment here), and a lock on its name
	// lists it.
	carol := filepath.Join(t.TempDir(), "carol.pem")
	if r := muster(t, []string{"MUSTER_CRL_URL=" + base}, "admin", "add", "carol", "--offline", "--data", e.dir, "--out", carol); r.code != 0 {
		t.Fatalf("admin add --offline: %s", r.stderr)
	}
	op := readCerts(t, carol)
	adminURL := base + "/crl/admin-" + op[1].SerialNumber.Text(16) + ".crl"
	if len(op[0].CRLDistributionPoints) != 1 || op[0].CRLDistributionPoints[0] != adminURL {
		t.Fatalf("the break-glass identity names %v, want %s", op[0].CRLDistributionPoints, adminURL)
	}
	mustRun(t, "lock", "create", "--admin", "carol", "--data", e.dir)
	lockedOp := time.Now()
	for rl, _ = fetchCRL(t, adminURL, op[1]); len(rl.RevokedCertificateEntries) == 0 && time.Since(lockedOp) < 5*time.Second; rl, _ = fetchCRL(t, adminURL, op[1]) {
		time.Sleep(200 * time.Millisecond)
	}
	if len(rl.RevokedCertificateEntries) != 1 || rl.RevokedCertificateEntries[0].SerialNumber.Cmp(op[0].SerialNumber) != 0 {
		t.Errorf("the admin list 5 s after locking carol: %+v", rl.RevokedCertificateEntries)
	}

	m := metricsOf(t, e.auth.metrics)
	for _, want := range []string{
		`muster_crl_entries{role="agent",serial="` + inter.SerialNumber.Text(16) + `"} 1`,
		`muster_crl_age_seconds{role="admin"`, `muster_crl_age_seconds{role="server"`, `muster_crl_age_seconds{role="bootstrap"`,
		`muster_crl_next_update_seconds{role="agent",serial="` + inter.SerialNumber.Text(16) + `"} `,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// TestCRLReplicas: two replicas on one PostgreSQL serve the same list; a
// lock made through one is listed by the other within 5 s, and an unlock
// through the other leaves both lists. It runs beside other tests: the
// store's change notifications bring a lock to every replica's list within
// about a second (docs/crl.md), five times less than the 5 s it is given.
func TestCRLReplicas(t *testing.T) {
	t.Parallel()
	url := postgres(t)
	dir := filepath.Join(t.TempDir(), "authority")
	mustRun(t, "init", "--data", dir, "--store", url)
	crlA, crlB := freePort(t), freePort(t)
	dirB := replicaDir(t, dir)
	a := &agentEnv{dir: dir, auth: startAuthority(t, dir, "--store", url, "--crl-listen", crlA, "--crl-url", "http://"+crlA)}
	b := &agentEnv{dir: dirB, auth: startAuthority(t, dirB, "--store", url, "--crl-listen", crlB, "--crl-url", "http://"+crlA)}

	adir := filepath.Join(t.TempDir(), "n1")
	tok := a.createToken(t, "--uses", "1")
	if r := muster(t, []string{"MUSTER_JOIN_TOKEN=" + tok.Token}, "agent", "join", "--data", adir, "--node", "n1",
		"--authority", b.auth.addr); r.code != 0 {
		t.Fatalf("agent join: %s", r.stderr)
	}
	certs := readCerts(t, filepath.Join(adir, "certs", "agent.crt"))
	path := "/crl/agent-" + certs[1].SerialNumber.Text(16) + ".crl"
	if certs[0].CRLDistributionPoints[0] != "http://"+crlA+path {
		t.Fatalf("a leaf from replica B names %v", certs[0].CRLDistributionPoints)
	}

	mustRun(t, "lock", "create", "--node", "n1", "--data", dir)
	locked := time.Now()
	var err error
	for err = opensslVerify(t, adir, "http://"+crlB+path, certs[1]); err == nil && time.Since(locked) < 5*time.Second; err = opensslVerify(t, adir, "http://"+crlB+path, certs[1]) {
		time.Sleep(200 * time.Millisecond)
	}
	if err == nil || !strings.Contains(err.Error(), "certificate revoked") {
		t.Fatalf("replica B's list 5 s after a lock through replica A: %v", err)
	}
	time.Sleep(1100 * time.Millisecond) // past each replica's one-second read cache
	_, derA := fetchCRL(t, "http://"+crlA+path, certs[1])
	_, derB := fetchCRL(t, "http://"+crlB+path, certs[1])
	if string(derA) != string(derB) {
		t.Error("the replicas serve different lists")
	}

	var locks []map[string]any
	json.Unmarshal([]byte(mustRun(t, "lock", "list", "--data", dirB, "-o", "json")), &locks)
	mustRun(t, "lock", "delete", locks[0]["id"].(string), "--data", dirB)
	unlocked := time.Now()
	for err = opensslVerify(t, adir, "http://"+crlA+path, certs[1]); err != nil && time.Since(unlocked) < 5*time.Second; err = opensslVerify(t, adir, "http://"+crlA+path, certs[1]) {
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("replica A's list 5 s after an unlock through replica B: %v", err)
	}
}

// TestCRLLockTTLEnds: a lock given a --ttl leaves the list when it ends,
// not at the list's next regular signing (half the validity, 12 hours by
// default): relying parties accept the node's certificate again once the
// lock the operator asked for is over.
func TestCRLLockTTLEnds(t *testing.T) {
	t.Parallel()
	crlAddr := freePort(t)
	base := "http://" + crlAddr
	e := newAgentEnv(t, "--crl-listen", crlAddr, "--crl-url", base) // the default validity, 24h
	adir := filepath.Join(t.TempDir(), "n1")
	tok := e.createToken(t, "--uses", "1")
	if r := muster(t, []string{"MUSTER_JOIN_TOKEN=" + tok.Token}, "agent", "join", "--data", adir, "--node", "n1",
		"--authority", e.auth.addr); r.code != 0 {
		t.Fatalf("agent join: %s", r.stderr)
	}
	certs := readCerts(t, filepath.Join(adir, "certs", "agent.crt"))
	inter := certs[1]
	url := base + "/crl/agent-" + inter.SerialNumber.Text(16) + ".crl"

	mustRun(t, "lock", "create", "--node", "n1", "--ttl", "4s", "--reason", "a short hold", "--data", e.dir)
	locked := time.Now()
	rl, _ := fetchCRL(t, url, inter)
	for len(rl.RevokedCertificateEntries) == 0 && time.Since(locked) < 3*time.Second {
		time.Sleep(100 * time.Millisecond)
		rl, _ = fetchCRL(t, url, inter)
	}
	if len(rl.RevokedCertificateEntries) != 1 {
		t.Fatalf("the list 3 s after a 4 s lock: %d entries, want 1", len(rl.RevokedCertificateEntries))
	}
	for len(rl.RevokedCertificateEntries) != 0 && time.Since(locked) < 20*time.Second {
		time.Sleep(200 * time.Millisecond)
		rl, _ = fetchCRL(t, url, inter)
	}
	if len(rl.RevokedCertificateEntries) != 0 {
		t.Fatalf("the list 20 s after a 4 s lock still holds %d entries (next update %v)", len(rl.RevokedCertificateEntries), rl.NextUpdate)
	}
	if err := opensslVerify(t, adir, url, inter); err != nil {
		t.Errorf("openssl verify -crl_check once the lock ended: %v", err)
	}
}
