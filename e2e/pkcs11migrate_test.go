//go:build pkcs11 && cgo

package e2e

import (
	"context"
	"crypto"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/agent"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/custody/softhsmtest"
	"github.com/muster-dev/muster/internal/store/sqlite"
)

// TestPKCS11MigrateCustody moves a running sealed authority into a
// SoftHSM2 token with muster ca migrate-custody while an agent with
// 10-second certificates renews all along: the token is recorded (a
// second run changes nothing), a replica without the module refuses to
// start naming the flags, the authority restarted with the module
// activates the successors prepared in the token (muster ca rotate ROLE
// --activate after the publish window), the agent's next certificates
// come from the token's agent intermediate with no renewal refused, the
// signer staged in the token is activated and signs a task the agent
// runs, ca status and signer list name the token objects, a root
// rotation makes its new root in the token, and no private key of the
// new keys is in the data directory or the store while pkcs11-tool lists
// them as never extractable.
func TestPKCS11MigrateCustody(t *testing.T) {
	t.Parallel()
	tok := softhsmtest.New(t)
	env := tok.Env()
	dir, _ := initDir(t)
	listen := freePort(t)
	authArgs := []string{"authority", "--data", dir, "--listen", listen, "--metrics-listen", "127.0.0.1:0", "--log-format", "json",
		"--agent-cert-ttl", "10s"}
	p, rec := startProcEnv(t, "authority", "authority started", env, authArgs...)
	p.addr, _ = rec["advertise"].(string)
	e := &agentEnv{dir: dir, auth: p}

	adir := filepath.Join(t.TempDir(), "agent")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	agentCmd := execCommand(ctx, "agent", "run", "--data", adir, "--log-format", "json")
	agentCmd.Env = append(agentCmd.Env, "MUSTER_JOIN_URI="+e.createToken(t).URI, "MUSTER_NODE_ID=n1")
	agentLogs := &syncWriter{w: &strings.Builder{}}
	logsOnFailure(t, "agent", agentLogs.String)
	agentCmd.Stderr = agentLogs
	if err := agentCmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		agentCmd.Process.Signal(syscall.SIGTERM)
		agentCmd.Wait()
	}()
	waitFor(t, 30*time.Second, "the agent joins and renews under the sealed intermediates", func() bool {
		st, err := agent.Dir(adir).ReadState()
		return err == nil && st.Generation >= 1
	})
	// A sealed successor prepared before the migration (by an operator
	// here, by the leader's clock in life) signed nothing: the migration
	// discards it for one in the token.
	mustRun(t, "ca", "rotate", "agent", "--data", dir)
	sealedInfo, err := os.ReadFile(filepath.Join(dir, "authority.json"))
	if err != nil {
		t.Fatal(err)
	}

	// Bad input changes nothing: a token that is not there.
	if r := muster(t, env, "ca", "migrate-custody", "--data", dir, "--custody", "pkcs11:token=absent",
		"--pkcs11-module", tok.Module, "--pkcs11-pin-file", tok.PINFile); r.code == 0 || !strings.Contains(r.stderr, "absent") {
		t.Fatalf("migrate-custody to a missing token: exit %d\n%s", r.code, r.stderr)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "authority.json")); string(got) != string(sealedInfo) {
		t.Fatalf("a refused migration changed authority.json:\n%s", got)
	}

	migrate := func() string {
		t.Helper()
		r := muster(t, env, "ca", "migrate-custody", "--data", dir, "--custody", tok.URI,
			"--pkcs11-module", tok.Module, "--pkcs11-pin-file", tok.PINFile)
		if r.code != 0 {
			t.Fatalf("ca migrate-custody: exit %d\n%s", r.code, r.stderr)
		}
		return r.stdout
	}
	out := migrate()
	// The steps name this data directory, to paste as they are.
	for _, want := range []string{"recorded in the store", "muster ca rotate $role --activate --data " + dir, "muster signer activate --data " + dir,
		"muster-pkcs11 authority --data " + dir + "\n", "--pkcs11-module " + tok.Module, "muster ca root rotate --data " + dir} {
		if !strings.Contains(out, want) {
			t.Errorf("migrate-custody's output lacks %q:\n%s", want, out)
		}
	}
	// So do the steps' own lines (each key's next step).
	for _, want := range []string{"or run `muster signer activate --data " + dir + "` once", "or run `muster ca rotate agent --activate --data " + dir + "` once"} {
		if !strings.Contains(out, want) {
			t.Errorf("migrate-custody's step lines lack %q:\n%s", want, out)
		}
	}
	if n := len(regexp.MustCompile(`(?m)^  \S+ +(prepared|staged) `).FindAllString(out, -1)); n != 5 {
		t.Errorf("migrate-custody prepared or staged %d keys, want 4 intermediates and a signer:\n%s", n, out)
	}
	assertTokenKeys(t, tok, 5)
	if d := auditOf(t, dir, "ca.discard"); len(d) != 1 || !strings.HasPrefix(d[0].Target, "agent/") || !strings.Contains(d[0].Reason, "replaced by one in the PKCS#11 token") {
		t.Errorf("the sealed agent successor was not discarded for the token's: %+v", d)
	}
	// A second run finds it all done and makes nothing.
	again := migrate()
	if !strings.Contains(again, "already recorded") || len(regexp.MustCompile(`(?m)^  \S+ +already `).FindAllString(again, -1)) != 5 {
		t.Errorf("a second migrate-custody did not say it was all done:\n%s", again)
	}
	assertTokenKeys(t, tok, 5)
	// The refusal; the token recorded, in the write that records it; the
	// first run's summary; the second's, which changed nothing.
	if a := auditOf(t, dir, "ca.migrate_custody"); len(a) != 4 || a[0].Result != "error" || !strings.Contains(a[0].Reason, "absent") ||
		a[1].Result != "ok" || !strings.Contains(a[1].Reason, "token recorded in the store") ||
		a[2].Result != "ok" || !strings.Contains(a[2].Reason, "ca/agent: prepared") || !strings.Contains(a[3].Reason, "ca/agent: already") {
		t.Errorf("ca.migrate_custody audit records: %+v", a)
	}

	// A replica whose authority.json does not name the token (a copy
	// of the directory from before) refuses to start, naming the flags.
	p.stop(t)
	if err := os.WriteFile(filepath.Join(dir, "authority.json"), sealedInfo, 0o600); err != nil {
		t.Fatal(err)
	}
	r := muster(t, env, authArgs...)
	if r.code == 0 || !strings.Contains(r.stderr, "--pkcs11-module PATH") || !strings.Contains(r.stderr, tok.URI) ||
		!strings.Contains(r.stderr, "--pkcs11-pin-file") {
		t.Fatalf("a replica without the module: exit %d\n%s", r.code, r.stderr)
	}
	// With the module it starts, on the same address the agent knows.
	p, rec = startProcEnv(t, "authority", "authority started", env,
		append(authArgs, "--pkcs11-module", tok.Module, "--pkcs11-pin-file", tok.PINFile)...)
	p.addr, _ = rec["advertise"].(string)
	checkTokenEnv(t, p, tok)
	waitFor(t, 20*time.Second, "the restarted authority is ready", func() bool {
		body, err := scrapePath(p.metrics, "/readyz")
		return err == nil && body == "ready\n"
	})

	// Activate each role once the successor is published.
	for _, role := range []string{"bootstrap", "server", "agent", "admin"} {
		waitFor(t, 30*time.Second, "the "+role+" successor in the token is activated", func() bool {
			return muster(t, nil, "ca", "rotate", role, "--activate", "--data", dir).code == 0
		})
	}
	// The agent's next certificates come from the token's intermediate.
	tokenAgentCA := activeIntermediate(t, dir, "agent")
	if !custody.IsPKCS11Ref(tokenAgentCA.ref) {
		t.Fatalf("the active agent intermediate's key is %q, not a token object", tokenAgentCA.ref)
	}
	after := agentState(t, adir).Generation
	waitFor(t, 40*time.Second, "two renewals signed by the token's agent intermediate", func() bool {
		st, err := agent.Dir(adir).ReadState()
		if err != nil || st.Generation < after+2 {
			return false
		}
		return agentLeaf(t, adir).CheckSignatureFrom(tokenAgentCA.cert) == nil
	})
	checkNoRefusedRenewal(t, metricsOf(t, p.metrics), "after the migration", false)

	// The signer staged in the token, activated, signs a task the agent
	// verifies and runs.
	mustRun(t, "signer", "activate", "--data", dir)
	nodeReportAnswered(t, dir, "n1", agentReach, "node.report signed by the token's signer answered")
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
	for _, s := range listed.Signers {
		inToken := strings.HasPrefix(s.KeyCustody, "pkcs11:token=muster;object=muster-signer%2F")
		if s.State == "active" && !inToken || s.State != "active" && s.KeyCustody != "sealed" {
			t.Errorf("signer %s (%s) key custody %q", s.VersionID, s.State, s.KeyCustody)
		}
	}

	// A root rotation makes its new root in the token.
	mustRun(t, "ca", "root", "rotate", "--data", dir)
	var cas struct {
		Certificates []struct {
			Kind       string `json:"kind"`
			Role       string `json:"role"`
			State      string `json:"state"`
			KeyCustody string `json:"key_custody"`
		} `json:"certificates"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "ca", "status", "--data", dir, "-o", "json")), &cas); err != nil {
		t.Fatal(err)
	}
	var roots, active []string
	for _, c := range cas.Certificates {
		switch {
		case c.Kind == "root":
			roots = append(roots, c.KeyCustody)
		case c.Kind == "intermediate" && c.State == "active":
			active = append(active, c.Role)
			if !strings.HasPrefix(c.KeyCustody, "pkcs11:token=muster;object=muster-ca%2F"+c.Role+"%2F") {
				t.Errorf("ca status: the active %s intermediate's key custody %q", c.Role, c.KeyCustody)
			}
		case c.Kind == "intermediate" && c.State == "retiring" && c.KeyCustody != "sealed":
			t.Errorf("ca status: the retiring %s intermediate's key custody %q, want sealed", c.Role, c.KeyCustody)
		}
	}
	inToken := 0
	for _, r := range roots {
		if strings.HasPrefix(r, "pkcs11:token=muster;object=muster-ca%2Froot%2F") {
			inToken++
		}
	}
	if len(active) != 4 || len(roots) != 2 || inToken != 1 {
		t.Errorf("ca status: active intermediates %v, root key custody %v; want 4, and the new root in the token", active, roots)
	}
	agentCmd.Process.Signal(syscall.SIGTERM)
	agentCmd.Wait()
	p.stop(t)

	// No private key of the keys now in the token anywhere in the data
	// directory or the store; the token holds them never extractable:
	// 4 intermediates, the signer, the new root.
	held := map[string]crypto.PublicKey{}
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "muster.db"))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := st.ListCACerts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if custody.IsPKCS11Ref(r.KeyRef) {
			c, _ := x509.ParseCertificate(r.CertDER)
			held["intermediate "+r.Role+"/"+r.Serial] = c.PublicKey
		}
	}
	signers, _, err := st.ListSigners(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range signers {
		if custody.IsPKCS11Ref(r.KeyRef) {
			held["signer "+r.VersionID] = r.PublicKey
		}
	}
	st.Close()
	if len(held) != 5 {
		t.Fatalf("%d keys in the token by the store, want 4 intermediates and a signer", len(held))
	}
	s := &keyScan{held: held, known: privateKeysIn(t, adir)}
	s.scanAuthority(t, dir)
	for _, f := range s.found {
		t.Errorf("%s: %s", f.where, f.what)
	}
	if s.filesKeys == 0 {
		t.Fatal("the scan found no private key at all: it looked in the wrong place")
	}
	assertTokenKeys(t, tok, 6)
}

type storedIntermediate struct {
	cert *x509.Certificate
	ref  []byte
}

// activeIntermediate reads role's active intermediate from the store.
func activeIntermediate(t *testing.T, dir, role string) storedIntermediate {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "muster.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rows, err := st.ListCACerts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.Role == role && r.State == "active" {
			c, err := x509.ParseCertificate(r.CertDER)
			if err != nil {
				t.Fatal(err)
			}
			return storedIntermediate{cert: c, ref: r.KeyRef}
		}
	}
	t.Fatalf("no active %s intermediate in the store", role)
	return storedIntermediate{}
}

// agentLeaf is the agent's certificate.
func agentLeaf(t *testing.T, adir string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(agent.Dir(adir).CertFile())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(data)
	if b == nil {
		t.Fatal("no PEM in the agent's certificate file")
	}
	leaf, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return leaf
}

// TestPKCS11MigrateCustodyRollback: a migration rolled back before any
// key in the token is used (the token lost, say) discards the successors
// and the signer made in it and forgets the token, so the authority
// starts again without the module; once a key in the token has signed,
// the rollback is refused and says to restore the token's backup.
func TestPKCS11MigrateCustodyRollback(t *testing.T) {
	t.Parallel()
	tok := softhsmtest.New(t)
	env := tok.Env()
	dir, _ := initDir(t)
	p := startAuthority(t, dir)
	migrate := func(extra ...string) result {
		t.Helper()
		return muster(t, env, append([]string{"ca", "migrate-custody", "--data", dir, "--custody", tok.URI}, extra...)...)
	}
	if r := migrate("--pkcs11-module", tok.Module, "--pkcs11-pin-file", tok.PINFile); r.code != 0 {
		t.Fatalf("migrate-custody: exit %d\n%s", r.code, r.stderr)
	}
	p.stop(t)
	r := migrate("--rollback")
	if r.code != 0 || !strings.Contains(r.stdout, "removed from the store") || strings.Count(r.stdout, "discarded") != 4 || !strings.Contains(r.stdout, "rolled back") {
		t.Fatalf("rollback: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// Each key the rollback leaves in the token (4 successors, the
	// staged signer) is named with the two commands that delete its
	// objects, which, pasted (the PIN given as pkcs11-tool would prompt
	// for it), leave nothing of muster's in the token. Before, it said
	// "delete it by hand if the token comes back" and named none.
	cmds := regexp.MustCompile("`(pkcs11-tool [^`]*)`").FindAllStringSubmatch(r.stdout, -1)
	if len(cmds) != 10 {
		t.Fatalf("the rollback names %d pkcs11-tool commands, want 2 for each of the 5 keys it leaves:\n%s", len(cmds), r.stdout)
	}
	for _, c := range cmds {
		if out, err := tok.Command("sh", "-c", c[1]+" --pin "+softhsmtest.PIN).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", c[1], err, out)
		}
	}
	out, err := tok.Command("pkcs11-tool", "--module", tok.Module, "--token-label", softhsmtest.Label, "--login", "--pin", softhsmtest.PIN,
		"--list-objects").CombinedOutput()
	if err != nil || strings.Contains(string(out), "muster-") {
		t.Fatalf("after the commands the rollback names (%v), the token holds:\n%s", err, out)
	}
	if r := migrate("--rollback"); r.code != 0 || !strings.Contains(r.stdout, "nothing to roll back") {
		t.Fatalf("a second rollback: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// The sealed authority starts again, without the module, and nothing
	// of the token is in use or waiting.
	p = startAuthority(t, dir)
	out = []byte(mustRun(t, "ca", "status", "--data", dir))
	// The audit records of the keys left name the module the store
	// recorded, never MODULE (the staged signer's destroy_key said
	// --module MODULE).
	for _, action := range []string{"node_task_signer.destroy_key", "ca.destroy_key", "ca.discard"} {
		a := auditOf(t, dir, action)
		if len(a) == 0 {
			t.Fatalf("no %s audit record after the rollback", action)
		}
		for _, e := range a {
			if !strings.Contains(e.Reason, "--module "+tok.Module+" ") || strings.Contains(e.Reason, "MODULE") {
				t.Errorf("%s audit record does not name the module %s: %s", action, tok.Module, e.Reason)
			}
		}
	}
	if strings.Contains(string(out), "prepared") {
		t.Errorf("ca status after the rollback lists a prepared intermediate:\n%s", out)
	}
	if out := mustRun(t, "signer", "list", "--data", dir); strings.Contains(out, "staged") || strings.Contains(out, "pkcs11:") && strings.Contains(out, "active") && !strings.Contains(out, "sealed") {
		t.Errorf("signer list after the rollback:\n%s", out)
	}

	// Migrated again and one intermediate activated: the rollback is refused.
	if r := migrate("--pkcs11-module", tok.Module, "--pkcs11-pin-file", tok.PINFile); r.code != 0 {
		t.Fatalf("migrate-custody again: exit %d\n%s", r.code, r.stderr)
	}
	p.stop(t)
	p, rec := startProcEnv(t, "authority", "authority started", env, "authority", "--data", dir,
		"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--log-format", "json")
	p.addr, _ = rec["advertise"].(string)
	waitFor(t, 30*time.Second, "the agent successor in the token is activated", func() bool {
		return muster(t, nil, "ca", "rotate", "agent", "--activate", "--data", dir).code == 0
	})
	if r := migrate("--rollback"); r.code == 0 || !strings.Contains(r.stderr, "restore the token from its backup") {
		t.Fatalf("rollback with the token's agent intermediate active: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	a := auditOf(t, dir, "ca.migrate_custody")
	// The token recorded, the summary, the rollback (with the token's
	// record removed), the second rollback, then the same again and the
	// refusal.
	if len(a) != 7 || a[len(a)-1].Result != "denied" || !strings.Contains(a[2].Reason, "rolled back: the token's record removed") ||
		!strings.Contains(a[3].Reason, "nothing to roll back") {
		t.Errorf("ca.migrate_custody audit records: %+v", a)
	}
	// Still in the token, the authority restarts with it.
	p.stop(t)
	startProcEnv(t, "authority", "authority started", env, "authority", "--data", dir,
		"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--log-format", "json")
}
