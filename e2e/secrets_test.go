package e2e

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/muster-dev/muster/internal/agent"
)

// secretSet is every secret a test made or was given, in each form it
// could leak in: as printed, raw bytes, hex and base64.
type secretSet struct {
	names   []string
	needles [][]byte
}

// add records secret s under name.
func (ss *secretSet) add(name, s string) {
	if len(s) < 12 {
		panic("secret " + name + " is too short to scan for: " + s)
	}
	ss.names = append(ss.names, name)
	ss.needles = append(ss.needles, []byte(s))
}

// addBytes records raw key material and its hex and base64 forms.
func (ss *secretSet) addBytes(name string, b []byte) {
	ss.add(name+" (raw)", string(b))
	ss.add(name+" (hex)", hex.EncodeToString(b))
	ss.add(name+" (base64)", base64.StdEncoding.EncodeToString(b))
	ss.add(name+" (base64url)", base64.RawURLEncoding.EncodeToString(b))
}

// addKeyFile records a private key file of an agent: its PEM body, the
// DER inside, and the private scalar or seed itself.
func (ss *secretSet) addKeyFile(t *testing.T, name, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("%s: no PEM", path)
	}
	for i, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if !strings.HasPrefix(line, "-----") && len(line) >= 32 {
			ss.add(fmt.Sprintf("%s PEM line %d", name, i), line)
		}
	}
	ss.addBytes(name+" DER", block.Bytes)
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		k, err2 := x509.ParseECPrivateKey(block.Bytes)
		if err2 != nil {
			t.Fatalf("%s: %v", path, err)
		}
		key = k
	}
	switch k := key.(type) {
	case *ecdsa.PrivateKey:
		d, _ := k.Bytes()
		ss.addBytes(name+" scalar", d)
	case ed25519.PrivateKey:
		ss.addBytes(name+" seed", k.Seed())
	default:
		t.Fatalf("%s: a %T", path, key)
	}
}

// scan fails the test for every secret found in what, named where.
func (ss *secretSet) scan(t *testing.T, where string, what []byte) {
	t.Helper()
	for i, n := range ss.needles {
		if bytes.Contains(what, n) {
			t.Errorf("%s holds %s", where, ss.names[i])
		}
	}
}

// TestNoSecretLeaks runs token, PSK and bound-keypair joins (with a
// registration secret), renewals, a PSK rotation and an operator's
// `admin add`, and some refusals of each, recording every secret made:
// token secrets, PSKs, the registration secret, the agents' private and
// bound keys, the keystores' passwords, the new operator's key and the
// storage key. None of them may appear in the authority's log, the audit
// log as `audit list -o json` prints it, /metrics, the output (errors
// included) of the agent, token get and admin add commands, or the SQLite
// database and its WAL.
//
// Left out by path, because holding a secret is what they are for: the
// key and password files of the agents and the operator (certs/agent.key,
// certs/agent.p12{,.pass}, keys/bound.key, the operator's PEM), the
// authority's storage.key and CA keys, and the stdout of the commands that
// hand out a secret (token create, bot add, psk show|rotate), which is
// their purpose. agent.yaml is not read (it holds a token before the
// join; the agent tests check it no longer does after).
func TestNoSecretLeaks(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	var ss secretSet
	// outputs are the stdout and stderr of every command run, none of
	// which hands out a secret.
	type output struct{ cmd, text string }
	var outputs []output
	run := func(env []string, args ...string) result {
		t.Helper()
		r := muster(t, env, args...)
		outputs = append(outputs, output{"muster " + args[0] + " " + args[1], r.stdout + r.stderr})
		return r
	}

	storageKey, err := os.ReadFile(filepath.Join(e.dir, "storage.key"))
	if err != nil {
		t.Fatal(err)
	}
	ss.add("storage key", strings.TrimSpace(string(storageKey)))
	if raw, err := hex.DecodeString(strings.TrimSpace(string(storageKey))); err == nil {
		ss.addBytes("storage key", raw)
	}
	psk := showPSKs(t, e.dir).Active.PSK
	ss.add("bootstrap PSK", psk)
	ss.add("bootstrap PSK hex", strings.TrimPrefix(psk, "muster-psk:"))

	// A token join and a renewal, and a join refused for a spent token.
	tok := e.createToken(t, "--uses", "1")
	ss.add("join token", tok.Token)
	ss.add("join token secret", tok.Token[strings.IndexByte(tok.Token, '.')+1:])
	tokDir := filepath.Join(t.TempDir(), "tok")
	if r := run(nil, "agent", "join", "--data", tokDir, "--node", "tok-node", "--token", tok.Token, "--authority", e.auth.addr,
		"--ca-fingerprint", e.fingerprint); r.code != 0 {
		t.Fatalf("token join: %s", r.stderr)
	}
	if r := run(nil, "agent", "renew", "--data", tokDir); r.code != 0 {
		t.Fatalf("renew: %s", r.stderr)
	}
	if r := run(nil, "agent", "join", "--data", filepath.Join(t.TempDir(), "spent"), "--node", "other", "--token", tok.Token,
		"--authority", e.auth.addr, "--ca-fingerprint", e.fingerprint); r.code == 0 {
		t.Fatal("a spent token joined")
	}
	wrong := tok.Token[:7] + strings.Repeat("0", len(tok.Token)-7)
	ss.add("mistyped join token", wrong)
	if r := run(nil, "agent", "join", "--data", filepath.Join(t.TempDir(), "wrong"), "--node", "other", "--token", wrong,
		"--authority", e.auth.addr, "--ca-fingerprint", e.fingerprint); r.code == 0 {
		t.Fatal("a wrong secret joined")
	}
	run(nil, "token", "get", tok.Token, "--data", e.dir) // a pasted token: shown by its ID alone

	// A PSK join and renewal; a rotation, and a join with the old PSK
	// after its grace is cut.
	pskDir := filepath.Join(t.TempDir(), "psk")
	if r := run([]string{"MUSTER_BOOTSTRAP_PSK=" + psk, "MUSTER_CA_FINGERPRINT=" + e.fingerprint}, "agent", "join", "--data", pskDir,
		"--node", "psk-node", "--authority", e.auth.addr); r.code != 0 {
		t.Fatalf("PSK join: %s", r.stderr)
	}
	if r := run(nil, "agent", "renew", "--data", pskDir); r.code != 0 {
		t.Fatalf("PSK agent renew: %s", r.stderr)
	}
	rotated := rotatePSK(t, e.dir, "--grace", "0s")
	ss.add("rotated PSK", rotated.Active.PSK)
	ss.add("rotated PSK hex", strings.TrimPrefix(rotated.Active.PSK, "muster-psk:"))
	if r := run([]string{"MUSTER_BOOTSTRAP_PSK=" + psk, "MUSTER_CA_FINGERPRINT=" + e.fingerprint}, "agent", "join",
		"--data", filepath.Join(t.TempDir(), "old-psk"), "--node", "late-node", "--authority", e.auth.addr); r.code == 0 {
		t.Fatal("the old PSK joined after its grace")
	}

	// A bound-keypair registration with its one-use secret, a refresh,
	// and the secret presented again.
	var reg botInfo
	out := mustRun(t, "bot", "add", "scanbot", "--data", e.dir, "-o", "json")
	reg = botOf(t, out)
	ss.add("registration secret", reg.BoundKeypair.RegistrationSecret)
	ss.add("joining URI", reg.URI)
	botDir := filepath.Join(t.TempDir(), "bot")
	if r := run([]string{"MUSTER_JOIN_URI=" + reg.URI}, "agent", "join", "--data", botDir); r.code != 0 {
		t.Fatalf("bound-keypair join: %s", r.stderr)
	}
	if r := run(nil, "agent", "renew", "--data", botDir); r.code != 0 {
		t.Fatalf("bound-keypair renew: %s", r.stderr)
	}
	if r := run([]string{"MUSTER_JOIN_URI=" + reg.URI}, "agent", "join", "--data", filepath.Join(t.TempDir(), "bot2")); r.code == 0 {
		t.Fatal("a used registration secret joined again")
	}

	// An operator added with admin add, and added again (refused).
	opFile := filepath.Join(t.TempDir(), "carol.pem")
	if r := run(nil, "admin", "add", "carol", "--data", e.dir, "--out", opFile); r.code != 0 {
		t.Fatalf("admin add: %s", r.stderr)
	}
	if r := run(nil, "admin", "add", "carol", "--data", e.dir, "--out", filepath.Join(t.TempDir(), "again.pem")); r.code == 0 {
		t.Fatal("admin add of an existing name succeeded")
	}

	for _, d := range []string{tokDir, pskDir, botDir} {
		ad := agent.Dir(d)
		ss.addKeyFile(t, d+" agent key", ad.KeyFile())
		pass, err := os.ReadFile(ad.PKCS12PasswordFile())
		if err != nil {
			t.Fatal(err)
		}
		ss.add(d+" keystore password", string(pass))
	}
	ss.addKeyFile(t, "bound key", agent.Dir(botDir).BoundKeyFile())
	opPEM, err := os.ReadFile(opFile)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for rest := opPEM; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if strings.Contains(b.Type, "PRIVATE KEY") {
			keyFile := filepath.Join(t.TempDir(), "carol.key")
			os.WriteFile(keyFile, pem.EncodeToMemory(b), 0o600)
			ss.addKeyFile(t, "operator key", keyFile)
			found = true
		}
	}
	if !found {
		t.Fatal("the operator's PEM has no private key")
	}

	// Where secrets must not be: while the authority runs (the WAL not
	// yet checkpointed) and after it stopped.
	ss.scan(t, "audit list -o json", []byte(mustRun(t, "audit", "list", "--data", e.dir, "-o", "json")))
	ss.scan(t, "/metrics", []byte(metricsOf(t, e.auth.metrics)))
	for _, o := range outputs {
		ss.scan(t, "the output of "+o.cmd, []byte(o.text))
	}
	scanDB := func(when string) {
		files, _ := filepath.Glob(filepath.Join(e.dir, "muster.db*"))
		if len(files) < 2 && when == "running" {
			t.Errorf("want the database and its WAL while running, found %v", files)
		}
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			ss.scan(t, when+": "+filepath.Base(f), data)
		}
	}
	scanDB("running")
	e.auth.stop(t)
	ss.scan(t, "the authority's log", []byte(e.auth.Logs()))
	scanDB("stopped")
	t.Logf("%d secret forms, none found", len(ss.needles))
}
