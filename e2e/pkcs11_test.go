//go:build pkcs11 && cgo

package e2e

import (
	"context"
	"crypto"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
	tok := softhsmtest.Start(t)
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
	waitFor(t, 10*time.Second, "the agent takes the rotate task", func() bool {
		for _, rec := range auditOf(t, dir, "task.result") {
			if strings.HasSuffix(rec.Actor, "/n1") && rec.Result == "ok" {
				return true
			}
		}
		return false
	})
	mustRun(t, "signer", "activate", "--data", dir)

	var sent struct {
		TaskID string `json:"task_id"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "task", "send", "--data", dir, "--type", "node.report", "--node", "n1", "-o", "json")), &sent); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "node.report signed by the token's v2 answered", func() bool {
		r := results(t, dir, sent.TaskID)["n1"]
		return r.Result == "ok" && strings.Contains(r.Reason, `"node_id":"n1"`)
	})

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
		held["intermediate "+r.Role] = cert.PublicKey
	}
	if len(caRows) != 4 {
		t.Errorf("%d intermediates in the store, want 4", len(caRows))
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
	for _, s := range listed.Signers {
		pub, err := signer.ParsePublicKey(s.PublicKey)
		if err != nil {
			t.Fatal(err)
		}
		held["listed signer "+s.VersionID] = pub
	}
	// No file in the data directory (nor the store's file) is the private
	// half of any of them: every PEM or DER private key found is parsed
	// and its public key compared.
	for _, role := range []ca.Role{ca.RoleBootstrap, ca.RoleServer, ca.RoleAgent, ca.RoleAdmin} {
		if _, err := os.Stat(filepath.Join(dir, "ca", string(role)+".key")); err == nil {
			t.Errorf("the data directory has a key file for the %s intermediate", role)
		}
	}
	found := 0
	filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for rest := data; ; {
			var b *pem.Block
			if b, rest = pem.Decode(rest); b == nil {
				break
			}
			if !strings.Contains(b.Type, "PRIVATE KEY") {
				continue
			}
			found++
			k, err := parseAnyKey(b.Bytes)
			if err != nil {
				t.Errorf("%s: a private key muster cannot parse: %v", path, err)
				continue
			}
			for what, pub := range held {
				if k.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(pub) {
					t.Errorf("%s holds the private key of the %s", path, what)
				}
			}
		}
		return nil
	})
	if found == 0 {
		t.Fatal("the scan found no private key at all (root, policy, operator are expected): it looked in the wrong place")
	}

	// The token holds them, never extractable.
	out, err := exec.Command("pkcs11-tool", "--module", tok.Module, "--token-label", softhsmtest.Label, "--login", "--pin", softhsmtest.PIN,
		"--list-objects", "--type", "privkey").CombinedOutput()
	if err != nil {
		t.Fatalf("pkcs11-tool: %v\n%s", err, out)
	}
	objs := strings.Split(string(out), "Private Key Object")[1:]
	if len(objs) != 6 {
		t.Errorf("the token holds %d private keys, want 6 (4 intermediates, 2 signers):\n%s", len(objs), out)
	}
	for _, o := range objs {
		if !strings.Contains(o, "never extractable") {
			t.Errorf("a private key in the token is extractable:\n%s", o)
		}
	}
}

// TestPKCS11InitNeedsAModuleAndAPIN: init with --custody refuses without
// a module or a PIN, and leaves no directory.
func TestPKCS11InitNeedsAModuleAndAPIN(t *testing.T) {
	tok := softhsmtest.Start(t)
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
	tok := softhsmtest.Start(t)
	dir := filepath.Join(t.TempDir(), "authority")
	r := muster(t, tok.Env(), "init", "--data", dir, "--custody", tok.URI, "--pkcs11-module", tok.Module, "--pkcs11-pin-file", tok.PINFile,
		"--store", "postgres://muster@127.0.0.1:1/muster?connect_timeout=2")
	if r.code == 0 {
		t.Fatal("init with an unreachable store succeeded")
	}
	if _, err := os.Stat(dir); err == nil {
		t.Error("a failed init left the data directory")
	}
	out, err := exec.Command("pkcs11-tool", "--module", tok.Module, "--token-label", softhsmtest.Label, "--login", "--pin", softhsmtest.PIN,
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

func parseAnyKey(der []byte) (crypto.Signer, error) {
	if k, err := x509.ParsePKCS8PrivateKey(der); err == nil {
		if s, ok := k.(crypto.Signer); ok {
			return s, nil
		}
	}
	return x509.ParseECPrivateKey(der)
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
