//go:build pkcs11 && cgo

package e2e

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/agent"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/custody/softhsmtest"
	"github.com/muster-dev/muster/internal/signer"
	"github.com/muster-dev/muster/internal/store/sqlite"
)

// This variant of the e2e tests runs the pkcs11 build of the binary.
func init() { buildTags = []string{"-tags", "pkcs11"} }

// TestPKCS11CustodyEndToEnd runs an authority whose CA intermediates and
// task signers live in a SoftHSM2 token: init with --custody, a token
// join, a renewal, a signer stage and activation, and a task signed by
// the new signer and verified by the agent. Then it checks that neither
// the data directory nor the store holds any of those private keys, and
// that the token holds them as never extractable.
func TestPKCS11CustodyEndToEnd(t *testing.T) {
	t.Parallel()
	tok := softhsmtest.New(t)
	env := tok.Env()
	dir := filepath.Join(t.TempDir(), "authority")
	r := muster(t, env, "init", "--data", dir, "-o", "json",
		"--custody", tok.URI, "--pkcs11-module", tok.Module, "--pkcs11-pin-file", tok.PINFile)
	if r.code != 0 {
		t.Fatalf("init --custody: exit %d\n%s", r.code, r.stderr)
	}
	p, rec := startProcEnv(t, "authority", "authority started", env, "authority", "--data", dir,
		"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--log-format", "json")
	p.addr, _ = rec["advertise"].(string)
	checkTokenEnv(t, p, tok)
	e := &agentEnv{dir: dir, auth: p}
	if body, err := scrapePath(p.metrics, "/readyz"); err != nil || body != "ready\n" {
		t.Fatalf("/readyz with the token open: %q %v", body, err)
	}

	adir := filepath.Join(t.TempDir(), "agent")
	if r := muster(t, nil, "agent", "join", "--data", adir, "--node", "n1", e.createToken(t).URI); r.code != 0 {
		t.Fatalf("join: %s", r.stderr)
	}
	mustRun(t, "agent", "renew", "--data", adir)
	if st := agentStatus(t, adir); st["generation"] != 1.0 {
		t.Fatalf("agent status after a renewal: %v", st)
	}
	startProc(t, "agent", "stream to the authority open", "agent", "run", "--data", adir, "--log-format", "json")

	mustRun(t, "signer", "stage", "--data", dir, "--effective-in", "15m")
	waitFor(t, agentReach, "the agent takes the rotate task", func() bool {
		for _, rec := range auditOf(t, dir, "task.result") {
			if strings.HasSuffix(rec.Actor, "/n1") && rec.Result == "ok" {
				return true
			}
		}
		return false
	})
	mustRun(t, "signer", "activate", "--data", dir)

	nodeReportAnswered(t, dir, "n1", agentReach, "node.report signed by the token's v2 answered")

	// signer list says where each key is: both in the token.
	var listed struct {
		Signers []struct {
			VersionID  string `json:"version_id"`
			State      string `json:"state"`
			PublicKey  string `json:"public_key"`
			KeyCustody string `json:"key_custody"`
		} `json:"signers"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "signer", "list", "--data", dir, "-o", "json")), &listed); err != nil {
		t.Fatal(err)
	}
	if len(listed.Signers) != 2 {
		t.Fatalf("signers: %+v", listed.Signers)
	}
	for _, s := range listed.Signers {
		if !strings.HasPrefix(s.KeyCustody, "pkcs11:token=muster;object=muster-signer%2Fv") {
			t.Errorf("signer %s (%s) key custody %q, want its token object", s.VersionID, s.State, s.KeyCustody)
		}
	}
	if text := mustRun(t, "signer", "list", "--data", dir); !strings.Contains(text, "KEY CUSTODY") || !strings.Contains(text, "pkcs11:token=muster") {
		t.Errorf("signer list text: %s", text)
	}
	// ca status says the same of the intermediates; the root key is the
	// data directory's file.
	var cas struct {
		Certificates []struct {
			Kind       string `json:"kind"`
			Role       string `json:"role"`
			KeyCustody string `json:"key_custody"`
		} `json:"certificates"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "ca", "status", "--data", dir, "-o", "json")), &cas); err != nil {
		t.Fatal(err)
	}
	intermediates := 0
	for _, c := range cas.Certificates {
		if c.Kind == "intermediate" {
			intermediates++
		}
		if want := "pkcs11:token=muster;object=muster-ca%2F" + c.Role + "%2F"; c.Kind == "intermediate" && !strings.HasPrefix(c.KeyCustody, want) ||
			c.Kind == "root" && c.KeyCustody != "file" {
			t.Errorf("ca status: %s %s key custody %q", c.Kind, c.Role, c.KeyCustody)
		}
	}
	if intermediates < 4 {
		t.Errorf("ca status lists %d intermediates", intermediates)
	}
	// Break-glass signs with the admin intermediate in the token, opened
	// by the command itself beside the running authority.
	bob := filepath.Join(t.TempDir(), "bob.pem")
	if r := muster(t, env, "admin", "add", "bob", "--offline", "--data", dir, "--ttl", "2h", "--out", bob); r.code != 0 {
		t.Fatalf("break-glass with the admin intermediate in the token: exit %d\n%s", r.code, r.stderr)
	}
	if out := mustRun(t, "status", "--identity", bob, "--authority", p.addr); !strings.Contains(out, "/admin/bob") {
		t.Errorf("status with the break-glass identity: %s", out)
	}
	p.stop(t)

	// The keys held in custody: the store's intermediates and signers.
	held := custodyHeld(t, dir, 4, 2, 0)
	for _, s := range listed.Signers {
		pub, err := signer.ParsePublicKey(s.PublicKey)
		if err != nil {
			t.Fatal(err)
		}
		held["listed signer "+s.VersionID] = pub
	}
	assertNoCustodyKeys(t, dir, held, privateKeysIn(t, adir))
	assertTokenKeys(t, tok, 6)
}

// TestPKCS11CustodyJoins: with the intermediates in a SoftHSM2 token, a
// PSK join through discovery (bootstrap PSK and referral ticket) and a
// bound-keypair join, each followed by a renewal, all signed by the
// token's intermediates; then no key file in the data directory, no
// private key in the store (nor the agents' own keys anywhere there), and
// the token's keys never extractable.
func TestPKCS11CustodyJoins(t *testing.T) {
	t.Parallel()
	tok := softhsmtest.New(t)
	env := tok.Env()
	dir := filepath.Join(t.TempDir(), "authority")
	r := muster(t, env, "init", "--data", dir, "-o", "json",
		"--custody", tok.URI, "--pkcs11-module", tok.Module, "--pkcs11-pin-file", tok.PINFile)
	if r.code != 0 {
		t.Fatalf("init --custody: exit %d\n%s", r.code, r.stderr)
	}
	var init map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &init); err != nil {
		t.Fatal(err)
	}
	e := &referralEnv{discDir: filepath.Join(t.TempDir(), "discovery"), dir: dir}
	e.authorityID, e.fingerprint, e.psk = init["authority_id"].(string), init["ca_fingerprint"].(string), init["bootstrap_psk"].(string)
	e.disc = startDiscovery(t, e.discDir, allowing(init)...)
	p, rec := startProcEnv(t, "authority", "authority started", env, "authority", "--data", dir,
		"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--log-format", "json",
		"--discovery", e.disc.addr, "--discovery-fingerprint", e.disc.fingerprint)
	p.addr, _ = rec["advertise"].(string)
	e.auth = p
	e.waitRegistered(t)

	// The agent certificate each join and renewal got is signed by the
	// agent intermediate, whose key is the token's.
	agentCA := func() *x509.Certificate {
		c, err := os.ReadFile(filepath.Join(dir, "ca", "agent.crt"))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := pem.Decode(c)
		cert, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return cert
	}()
	signedByToken := func(adir, what string) {
		t.Helper()
		st := agentState(t, adir)
		data, err := os.ReadFile(agent.Dir(adir).CertFile())
		if err != nil {
			t.Fatal(err)
		}
		b, _ := pem.Decode(data)
		leaf, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if err := leaf.CheckSignatureFrom(agentCA); err != nil {
			t.Errorf("%s (serial %s): not signed by the token's agent intermediate: %v", what, st.Serial, err)
		}
	}

	// PSK join through discovery, then a renewal.
	padir := e.mustJoin(t, "psk-1")
	if st := agentStatus(t, padir); st["join_method"] != "psk" {
		t.Fatalf("status after the PSK join: %v", st)
	}
	if a := auditJoins(t, dir); !strings.Contains(a, "referral ticket") {
		t.Errorf("the PSK join's audit record names no referral ticket:\n%s", a)
	}
	signedByToken(padir, "the PSK join's certificate")
	joined := agentState(t, padir).Serial
	mustRun(t, "agent", "renew", "--data", padir)
	if st := agentStatus(t, padir); st["generation"] != 1.0 || agentState(t, padir).Serial == joined {
		t.Fatalf("status after the PSK agent's renewal: %v", st)
	}
	signedByToken(padir, "the PSK agent's renewed certificate")

	// Bound-keypair join, then a renewal.
	badir := filepath.Join(t.TempDir(), "bound")
	_, keyFile := keypairFile(t, badir)
	mustRun(t, "bot", "add", "bot-1", "--public-key", keyFile, "--recovery-limit", "2", "--data", dir)
	mustRun(t, "agent", "join", "--data", badir, "--bound-keypair", "bot-1", "--node", "bot-1",
		"--authority", p.addr, "--ca-fingerprint", e.fingerprint)
	bst := agentState(t, badir)
	if bst.JoinMethod != agent.JoinMethodBoundKeypair || bst.JoinState == "" {
		t.Fatalf("state.json after the bound-keypair join: %+v", bst)
	}
	signedByToken(badir, "the bound-keypair join's certificate")
	mustRun(t, "agent", "renew", "--data", badir)
	if st := agentState(t, badir); st.Serial == bst.Serial {
		t.Fatalf("the bound-keypair agent's renewal kept serial %s", st.Serial)
	}
	signedByToken(badir, "the bound-keypair agent's renewed certificate")
	// (A bound-keypair agent renews through the bound-keypair exchange,
	// with its join state: two of them.)
	if m := metricsOf(t, p.metrics); !strings.Contains(m, `muster_joins_total{method="psk",result="ok"} 1`) ||
		!strings.Contains(m, `muster_joins_total{method="bound-keypair",result="ok"} 2`) {
		t.Errorf("authority metrics lack one PSK join and two bound-keypair exchanges:\n%s", m)
	}
	p.stop(t)

	// A migration rollback over an authority made in the token finds no
	// migration to undo, and keys the token holds: refused, and
	// authority.json keeps the token.
	if r := muster(t, env, "ca", "migrate-custody", "--data", dir, "--custody", tok.URI, "--rollback"); r.code == 0 ||
		!strings.Contains(r.stderr, "records no migration") || !strings.Contains(r.stderr, "in the token") {
		t.Errorf("migrate-custody --rollback over an authority made with init --custody: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if info, err := os.ReadFile(filepath.Join(dir, "authority.json")); err != nil || !strings.Contains(string(info), tok.URI) {
		t.Errorf("authority.json after a refused rollback: %s %v", info, err)
	}

	held := custodyHeld(t, dir, 4, 1, 1)
	known := privateKeysIn(t, padir)
	for k, v := range privateKeysIn(t, badir) {
		known[k] = v
	}
	if len(known) < 3 {
		t.Fatalf("the agents' private keys: %d found, want their certificate keys and the bound key", len(known))
	}
	assertNoCustodyKeys(t, dir, held, known)
	assertTokenKeys(t, tok, 6) // 4 intermediates, the signer, the join-state key
}

// custodyHeld is the public keys of the store's intermediates, signers
// and join-state keys, each checked to be a token object, and their
// numbers.
func custodyHeld(t *testing.T, dir string, intermediates, signers, joinStateKeys int) map[string]crypto.PublicKey {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "muster.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	held := map[string]crypto.PublicKey{}
	caRows, err := st.ListCACerts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range caRows {
		if !custody.IsPKCS11Ref(r.KeyRef) {
			t.Errorf("intermediate %s/%s: the store holds its key (a sealed reference), not a token object", r.Role, r.Serial)
		}
		cert, err := x509.ParseCertificate(r.CertDER)
		if err != nil {
			t.Fatal(err)
		}
		held["intermediate "+r.Role+"/"+r.Serial] = cert.PublicKey
	}
	sRows, _, err := st.ListSigners(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range sRows {
		if !custody.IsPKCS11Ref(r.KeyRef) {
			t.Errorf("signer %s: the store holds its key (a sealed reference), not a token object", r.VersionID)
		}
		held["signer "+r.VersionID] = r.PublicKey
	}
	jRows, err := st.ListJoinStateKeys(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range jRows {
		if len(r.Nonce) != 0 || !custody.IsPKCS11Ref(r.Ciphertext) {
			t.Errorf("join-state key %s: the store holds it sealed, not as a token object (%q)", r.ID, r.Ciphertext)
		}
		held["join-state key "+r.ID] = ed25519.PublicKey(r.PublicKey)
	}
	if len(caRows) != intermediates || len(sRows) != signers || len(jRows) != joinStateKeys {
		t.Errorf("%d intermediates, %d signers and %d join-state keys in the store, want %d, %d and %d",
			len(caRows), len(sRows), len(jRows), intermediates, signers, joinStateKeys)
	}
	return held
}

// assertNoCustodyKeys: no key file for an intermediate, no file in the
// data directory holding the private half of a held key, no private key
// in the store, and none of the known keys' raw secrets anywhere
// (keyScan); and the scan did see the keys that are files (root, policy,
// operator), so it looked in the right place.
func assertNoCustodyKeys(t *testing.T, dir string, held map[string]crypto.PublicKey, known map[string]crypto.Signer) {
	t.Helper()
	for _, role := range []ca.Role{ca.RoleBootstrap, ca.RoleServer, ca.RoleAgent, ca.RoleAdmin} {
		if _, err := os.Stat(filepath.Join(dir, "ca", string(role)+".key")); err == nil {
			t.Errorf("the data directory has a key file for the %s intermediate", role)
		}
	}
	s := &keyScan{held: held, known: known}
	s.scanAuthority(t, dir)
	for _, f := range s.found {
		t.Errorf("%s: %s", f.where, f.what)
	}
	if s.filesKeys == 0 {
		t.Fatal("the scan found no private key at all (root, policy, operator are expected): it looked in the wrong place")
	}
}

// checkTokenEnv: the running process p sees this test's own token (its
// SOFTHSM2_CONF, so tests with a token each run in parallel) and no PIN in
// its environment: it reads the PIN from the file --pkcs11-pin-file (or
// authority.json) names, as docs/hsm.md has it.
func checkTokenEnv(t *testing.T, p *proc, tok softhsmtest.Token) {
	t.Helper()
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	conf := ""
	for _, kv := range strings.Split(string(environ), "\x00") {
		k, v, _ := strings.Cut(kv, "=")
		switch {
		case k == custody.PINEnv || strings.TrimSpace(v) == softhsmtest.PIN:
			t.Errorf("%s's environment holds the token's PIN (%s)", p.name, k)
		case k == "SOFTHSM2_CONF":
			conf = v
		}
	}
	if conf != tok.Conf {
		t.Errorf("%s's SOFTHSM2_CONF is %q, want this test's %s", p.name, conf, tok.Conf)
	}
}

// assertTokenKeys: pkcs11-tool lists want private keys in the token, each
// never extractable.
func assertTokenKeys(t *testing.T, tok softhsmtest.Token, want int) {
	t.Helper()
	out, err := tok.Command("pkcs11-tool", "--module", tok.Module, "--token-label", softhsmtest.Label, "--login", "--pin", softhsmtest.PIN,
		"--list-objects", "--type", "privkey").CombinedOutput()
	if err != nil {
		t.Fatalf("pkcs11-tool: %v\n%s", err, out)
	}
	objs := strings.Split(string(out), "Private Key Object")[1:]
	if len(objs) != want {
		t.Errorf("the token holds %d private keys, want %d:\n%s", len(objs), want, out)
	}
	for _, o := range objs {
		if !strings.Contains(o, "never extractable") || !strings.Contains(o, "sensitive") {
			t.Errorf("a private key in the token is extractable or not sensitive:\n%s", o)
		}
	}
}

// TestPKCS11InitNeedsAModuleAndAPIN: init with --custody refuses without
// a module or a PIN, and leaves no directory.
func TestPKCS11InitNeedsAModuleAndAPIN(t *testing.T) {
	t.Parallel()
	tok := softhsmtest.New(t)
	dir := filepath.Join(t.TempDir(), "authority")
	r := muster(t, tok.Env(), "init", "--data", dir, "--custody", tok.URI)
	if r.code == 0 || !strings.Contains(r.stderr, "--pkcs11-module PATH") {
		t.Errorf("without a module: exit %d %s", r.code, r.stderr)
	}
	r = muster(t, tok.Env(), "init", "--data", dir, "--custody", tok.URI, "--pkcs11-module", tok.Module)
	if r.code == 0 || !strings.Contains(r.stderr, custody.PINEnv) {
		t.Errorf("without a PIN: exit %d %s", r.code, r.stderr)
	}
	if _, err := os.Stat(dir); err == nil {
		t.Error("a failed init left the data directory")
	}
}

// TestPKCS11FailedInitLeavesNoObject: an init with --custody that fails
// after generating the intermediates' keys in the token (its store cannot
// be reached) destroys them: the token holds no object afterwards, and no
// directory is left.
func TestPKCS11FailedInitLeavesNoObject(t *testing.T) {
	t.Parallel()
	tok := softhsmtest.New(t)
	dir := filepath.Join(t.TempDir(), "authority")
	r := muster(t, tok.Env(), "init", "--data", dir, "--custody", tok.URI, "--pkcs11-module", tok.Module, "--pkcs11-pin-file", tok.PINFile,
		"--store", "postgres://muster@127.0.0.1:1/muster?connect_timeout=2")
	if r.code == 0 {
		t.Fatal("init with an unreachable store succeeded")
	}
	if _, err := os.Stat(dir); err == nil {
		t.Error("a failed init left the data directory")
	}
	out, err := tok.Command("pkcs11-tool", "--module", tok.Module, "--token-label", softhsmtest.Label, "--login", "--pin", softhsmtest.PIN,
		"--list-objects").CombinedOutput()
	if err != nil {
		t.Fatalf("pkcs11-tool: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "Object") {
		t.Fatalf("after a failed init the token holds objects:\n%s\n(init said: %s)", out, r.stderr)
	}
	if !strings.Contains(r.stderr, "127.0.0.1:1") && !strings.Contains(r.stderr, "connect") {
		t.Errorf("init failed for another reason than the store: %s", r.stderr)
	}
}

func scrapePath(addr, path string) (string, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}

// nodeReportAnswered sends node a node.report task and waits, within,
// for its answer: run, and naming the node (what says which signer the
// test expects to have signed it).
func nodeReportAnswered(t *testing.T, dir, node string, within time.Duration, what string) {
	t.Helper()
	var sent struct {
		TaskID string `json:"task_id"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "task", "send", "--data", dir, "--type", "node.report", "--node", node, "-o", "json")), &sent); err != nil {
		t.Fatal(err)
	}
	var last auditRec
	defer func() {
		if t.Failed() {
			// An answer recorded other than ok stands (the first answer
			// does): it says why the wait failed.
			t.Logf("task %s's answer recorded for %s: %+v", sent.TaskID, node, last)
		}
	}()
	waitFor(t, within, what, func() bool {
		last = results(t, dir, sent.TaskID)[node]
		return last.Result == "ok" && strings.Contains(last.Reason, `"node_id":"`+node+`"`)
	})
}

// TestPKCS11EndedSignersLoseTheirKeys walks docs/hsm.md's signer steps on
// SoftHSM2: a signer staged in the token and rolled back, and the first
// signer retired after a rotation, each lose their token object at once
// (pkcs11-tool no longer lists it), signer list says destroyed, and the
// audit record of the step says so; the active signer keeps its object
// and signs.
func TestPKCS11EndedSignersLoseTheirKeys(t *testing.T) {
	t.Parallel()
	tok := softhsmtest.New(t)
	env := tok.Env()
	dir := filepath.Join(t.TempDir(), "authority")
	r := muster(t, env, "init", "--data", dir, "-o", "json",
		"--custody", tok.URI, "--pkcs11-module", tok.Module, "--pkcs11-pin-file", tok.PINFile)
	if r.code != 0 {
		t.Fatalf("init --custody: exit %d\n%s", r.code, r.stderr)
	}
	p, rec := startProcEnv(t, "authority", "authority started", env, "authority", "--data", dir,
		"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--log-format", "json")
	p.addr, _ = rec["advertise"].(string)

	signers := func() map[string]string {
		t.Helper()
		var listed struct {
			Signers []struct {
				VersionID  string `json:"version_id"`
				State      string `json:"state"`
				KeyCustody string `json:"key_custody"`
			} `json:"signers"`
		}
		if err := json.Unmarshal([]byte(mustRun(t, "signer", "list", "--data", dir, "-o", "json")), &listed); err != nil {
			t.Fatal(err)
		}
		m := map[string]string{}
		for _, s := range listed.Signers {
			m[s.VersionID] = s.State + " " + s.KeyCustody
		}
		return m
	}
	staged := func() string {
		t.Helper()
		mustRun(t, "signer", "stage", "--data", dir, "--effective-in", "15m")
		for id, s := range signers() {
			if strings.HasPrefix(s, "staged pkcs11:") {
				return id
			}
		}
		t.Fatalf("no staged signer in the token: %v", signers())
		return ""
	}
	label := func(id string) string { base, _, _ := strings.Cut(id, "-"); return "muster-signer/" + base }

	if got := tokenSignerLabels(t, tok); strings.Join(got, " ") != "muster-signer/v1" {
		t.Fatalf("the token's signer keys after init: %v", got)
	}
	v2 := staged()
	if got := tokenSignerLabels(t, tok); strings.Join(got, " ") != "muster-signer/v1 "+label(v2) {
		t.Fatalf("the token's signer keys with %s staged: %v", v2, got)
	}
	mustRun(t, "signer", "rollback", "--data", dir)
	if got := tokenSignerLabels(t, tok); strings.Join(got, " ") != "muster-signer/v1" {
		t.Errorf("the token's signer keys after rolling %s back: %v; want its object destroyed", v2, got)
	}
	if s := signers()[v2]; s != "retired destroyed" {
		t.Errorf("signer list: the rolled-back %s is %q, want retired destroyed", v2, s)
	}
	// The step's record says the key goes after it; the destruction has
	// its own record, written with the reference's drop.
	if recs := auditOf(t, dir, "node_task_signer.rollback"); len(recs) != 1 || !strings.Contains(recs[0].Reason, v2+"'s key (pkcs11:") || !strings.Contains(recs[0].Reason, ") is destroyed after the step") {
		t.Errorf("rollback audit %+v; want it to say the key is destroyed after it", recs)
	}
	if recs := auditOf(t, dir, "node_task_signer.destroy_key"); len(recs) != 1 || recs[0].Target != v2 || !strings.Contains(recs[0].Reason, ") destroyed") {
		t.Errorf("destroy_key audit %+v; want it to say %s's key was destroyed", recs, v2)
	}

	// A rotation: the first signer retires and its object goes; the new
	// active one keeps its object and signs.
	v3 := staged()
	mustRun(t, "signer", "activate", "--data", dir)
	mustRun(t, "signer", "retire", "--data", dir)
	if got := tokenSignerLabels(t, tok); strings.Join(got, " ") != label(v3) {
		t.Errorf("the token's signer keys after v1 retired: %v; want only %s's", got, v3)
	}
	list := signers()
	if list["v1"] != "retired destroyed" || !strings.HasPrefix(list[v3], "active pkcs11:") {
		t.Errorf("signer list after the rotation: %v", list)
	}
	if recs := auditOf(t, dir, "node_task_signer.retire"); len(recs) != 1 || !strings.Contains(recs[0].Reason, "v1's key (pkcs11:") || !strings.Contains(recs[0].Reason, ") is destroyed after the step") {
		t.Errorf("retire audit %+v; want it to say the key is destroyed after it", recs)
	}
	if recs := auditOf(t, dir, "node_task_signer.destroy_key"); len(recs) != 2 || recs[1].Target != "v1" || !strings.Contains(recs[1].Reason, ") destroyed") {
		t.Errorf("destroy_key audit %+v; want the second to say v1's key was destroyed", recs)
	}
	// A join carries the verifier set the active signer signs, and a task
	// goes out signed by it.
	e := &agentEnv{dir: dir, auth: p}
	if r := muster(t, nil, "agent", "join", "--data", filepath.Join(t.TempDir(), "agent"), "--node", "n1", e.createToken(t).URI); r.code != 0 {
		t.Fatalf("join after the rotation: %s", r.stderr)
	}
	if out := mustRun(t, "task", "send", "--data", dir, "--type", "node.report", "--node", "n1", "-o", "json"); !strings.Contains(out, `"signer_version_id": "`+v3+`"`) {
		t.Errorf("a task after the rotation: %s; want it signed by %s", out, v3)
	}
	assertTokenKeys(t, tok, 5) // 4 intermediates and the active signer
}

// tokenSignerLabels lists the labels of the signers' private keys in the
// token, sorted, as pkcs11-tool shows them.
func tokenSignerLabels(t *testing.T, tok softhsmtest.Token) []string {
	t.Helper()
	out, err := tok.Command("pkcs11-tool", "--module", tok.Module, "--token-label", softhsmtest.Label, "--login", "--pin", softhsmtest.PIN,
		"--list-objects", "--type", "privkey").CombinedOutput()
	if err != nil {
		t.Fatalf("pkcs11-tool: %v\n%s", err, out)
	}
	var labels []string
	for _, line := range strings.Split(string(out), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if v = strings.TrimSpace(v); ok && k == "label" && strings.HasPrefix(v, "muster-signer/") {
			labels = append(labels, v)
		}
	}
	slices.Sort(labels)
	return labels
}

// initCustody makes a SoftHSM2 token for this test and inits an authority
// directory whose CA keys are made in it; env is what a muster process
// needs to open the token.
func initCustody(t *testing.T) (tok softhsmtest.Token, env []string, dir string) {
	t.Helper()
	tok = softhsmtest.New(t)
	env = tok.Env()
	dir = filepath.Join(t.TempDir(), "authority")
	if r := muster(t, env, "init", "--data", dir, "--custody", tok.URI, "--pkcs11-module", tok.Module, "--pkcs11-pin-file", tok.PINFile); r.code != 0 {
		t.Fatalf("init --custody: exit %d\n%s", r.code, r.stderr)
	}
	return tok, env, dir
}
