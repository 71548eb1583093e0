package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

type rootCertOut struct {
	Fingerprint string `json:"fingerprint"`
	PEM         string `json:"pem"`
}

type rootStatusOut struct {
	Phase             string        `json:"phase"`
	PreviousPhase     string        `json:"previous_phase"`
	OldRoot           *rootCertOut  `json:"old_root"`
	NewRoot           *rootCertOut  `json:"new_root"`
	SigningRoot       *rootCertOut  `json:"signing_root"`
	TrustedRoots      []rootCertOut `json:"trusted_roots"`
	CrossCertificates []rootCertOut `json:"cross_certificates"`
	JoinFingerprint   string        `json:"join_fingerprint"`
}

// caRoot runs muster ca root ARGS -o json against the authority of dir.
func caRoot(t *testing.T, dir string, args ...string) rootStatusOut {
	t.Helper()
	out := mustRun(t, append(append([]string{"ca", "root"}, args...), "--data", dir, "-o", "json")...)
	var st rootStatusOut
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("ca root %v -o json printed %q: %v", args, out, err)
	}
	return st
}

// TestRootRotationPhases drives a root rotation through the binary: rotate
// (and abandon one from init), each phase reached, rolled back from and
// reached again; in every phase of the overlap a PSK join pinned to the
// old root's fingerprint and one pinned to the new root's both work, as
// does a join by the URI muster token create prints (the old fingerprint
// until update_servers, the new one from then on); a leaf issued in
// update_servers verifies with openssl against the new root; in standby a
// join pinned to the old root is refused and one pinned to the new root
// works; every step is audited.
func TestRootRotationPhases(t *testing.T) {
	t.Parallel()
	dir, init := initDir(t)
	e := &agentEnv{dir: dir, auth: startAuthority(t, dir)}
	e.authorityID, _ = init["authority_id"].(string)
	e.fingerprint, _ = init["ca_fingerprint"].(string)
	key := init["bootstrap_psk"].(string)
	oldFP := e.fingerprint

	if st := caRoot(t, dir, "status"); st.Phase != "none" || st.SigningRoot == nil || st.SigningRoot.Fingerprint != oldFP || st.NewRoot != nil {
		t.Fatalf("status before any rotation: %+v", st)
	}
	if msg := mustFail(t, "ca", "root", "next-phase", "--data", dir); !strings.Contains(msg, "FAILED_PRECONDITION") || !strings.Contains(msg, "muster ca root rotate") {
		t.Fatalf("next-phase with no rotation: %s", msg)
	}
	if msg := mustFail(t, "ca", "root", "rollback", "--data", dir); !strings.Contains(msg, "no root rotation to roll back") {
		t.Fatalf("rollback with no rotation: %s", msg)
	}

	// A rotation abandoned from init.
	st := caRoot(t, dir, "rotate")
	if st.Phase != "init" || st.NewRoot == nil || len(st.TrustedRoots) != 2 || len(st.CrossCertificates) != 2 {
		t.Fatalf("after rotate: %+v", st)
	}
	abandoned := st.NewRoot.Fingerprint
	if st = caRoot(t, dir, "rollback"); st.Phase != "none" || st.NewRoot != nil || len(st.TrustedRoots) != 1 {
		t.Fatalf("rollback from init: %+v; want phase none and the new root gone", st)
	}
	st = caRoot(t, dir, "rotate")
	newFP := st.NewRoot.Fingerprint
	if newFP == abandoned || newFP == oldFP {
		t.Fatalf("the second rotation's root %s is not a new one", newFP)
	}
	if msg := mustFail(t, "ca", "root", "rotate", "--data", dir); !strings.Contains(msg, "in progress") {
		t.Fatalf("rotate during a rotation: %s", msg)
	}
	newRoot := filepath.Join(t.TempDir(), "new-root.pem")
	if err := os.WriteFile(newRoot, []byte(st.NewRoot.PEM), 0o644); err != nil {
		t.Fatal(err)
	}

	n := 0
	join := func(fp string) result {
		n++
		adir := filepath.Join(t.TempDir(), "a")
		return pskJoin(t, e, adir, "n"+strconv.Itoa(n), key, fp)
	}
	joinBoth := func(phase string) {
		t.Helper()
		for _, fp := range []string{oldFP, newFP} {
			if r := join(fp); r.code != 0 {
				t.Fatalf("%s: PSK join pinned to %s: exit %d\n%s", phase, fp, r.code, r.stderr)
			}
		}
	}
	tokenJoin := func(phase, wantFP string) {
		t.Helper()
		tok := e.createToken(t)
		if !strings.Contains(tok.URI, "fingerprint="+wantFP) {
			t.Fatalf("%s: token create printed %s; want the fingerprint %s", phase, tok.URI, wantFP)
		}
		n++
		r := muster(t, []string{"MUSTER_AGENT_DATA=" + filepath.Join(t.TempDir(), "t"), "MUSTER_JOIN_URI=" + tok.URI, "MUSTER_NODE_ID=t" + strconv.Itoa(n)}, "agent", "join")
		if r.code != 0 {
			t.Fatalf("%s: join by the token's URI: exit %d\n%s", phase, r.code, r.stderr)
		}
	}
	// A join token with --ca-fingerprint: the bundle it fetches must hold
	// the pinned root, and the server's chain verify from it.
	tokenPinned := func(phase string) {
		t.Helper()
		for _, fp := range []string{oldFP, newFP} {
			tok := e.createToken(t)
			n++
			r := muster(t, []string{"MUSTER_JOIN_TOKEN=" + tok.Token}, "agent", "join", "--data", filepath.Join(t.TempDir(), "p"),
				"--node", "p"+strconv.Itoa(n), "--authority", e.auth.addr, "--ca-fingerprint", fp)
			if r.code != 0 {
				t.Fatalf("%s: token join pinned to %s: exit %d\n%s", phase, fp, r.code, r.stderr)
			}
		}
	}
	step := func(cmd, want string) {
		t.Helper()
		if st := caRoot(t, dir, cmd); st.Phase != want {
			t.Fatalf("%s: phase %s, want %s", cmd, st.Phase, want)
		}
	}

	joinBoth("init")
	tokenJoin("init", oldFP)
	tokenPinned("init")
	step("next-phase", "update_agents")
	step("rollback", "init")
	step("next-phase", "update_agents")
	joinBoth("update_agents")
	tokenJoin("update_agents", oldFP)
	step("next-phase", "update_servers")
	step("rollback", "update_agents")
	step("next-phase", "update_servers")

	// The leader moves the intermediates under the new root within
	// moments: a leaf issued now verifies against the new root alone.
	deadline := time.Now().Add(30 * time.Second)
	for {
		n++
		adir := filepath.Join(t.TempDir(), "us")
		if r := pskJoin(t, e, adir, "us"+strconv.Itoa(n), key, newFP); r.code != 0 {
			t.Fatalf("update_servers: PSK join pinned to the new root: exit %d\n%s", r.code, r.stderr)
		}
		leaf := filepath.Join(adir, "certs", "agent.crt")
		out, err := exec.Command("openssl", "verify", "-CAfile", newRoot, "-untrusted", leaf, "-purpose", "sslclient", leaf).CombinedOutput()
		if err == nil && strings.Contains(string(out), ": OK") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("update_servers: 30 s on, a new agent's certificate still does not verify against the new root: %v\n%s", err, out)
		}
		time.Sleep(time.Second)
	}
	joinBoth("update_servers")
	tokenJoin("update_servers", newFP)
	tokenPinned("update_servers")
	if st := caRoot(t, dir, "status"); st.JoinFingerprint != newFP || st.SigningRoot.Fingerprint != newFP {
		t.Fatalf("update_servers: status %+v; want the new root signing and pinned by joining URIs", st)
	}
	// The operator identity moves under the new root before standby; a
	// copy left under the old root (another replica's data directory)
	// cannot reach the authority from standby on, and says how to get a
	// new identity.
	stale := filepath.Join(t.TempDir(), "stale.pem")
	if data, err := os.ReadFile(filepath.Join(dir, "operator.pem")); err != nil || os.WriteFile(stale, data, 0o600) != nil {
		t.Fatalf("copying the operator identity: %v", err)
	}
	mustRun(t, "admin", "renew", "--data", dir)

	step("next-phase", "standby")
	if st := caRoot(t, dir, "status"); len(st.TrustedRoots) != 1 || st.TrustedRoots[0].Fingerprint != newFP {
		t.Fatalf("standby: trusted %+v; want the new root alone", st.TrustedRoots)
	}
	if r := join(oldFP); r.code == 0 || !strings.Contains(r.stderr, "does not end at the root of the CA fingerprint") {
		t.Fatalf("standby: a join pinned to the old root: exit %d\n%s; want refused before the PSK is sent", r.code, r.stderr)
	}
	if r := join(newFP); r.code != 0 {
		t.Fatalf("standby: PSK join pinned to the new root: exit %d\n%s", r.code, r.stderr)
	}
	tokenJoin("standby", newFP)
	if msg := mustFail(t, "status", "--identity", stale, "--authority", e.auth.addr); !strings.Contains(msg, "does not chain to the roots in "+stale) ||
		!strings.Contains(msg, "muster admin add admin --offline --data DIR --out admin-new.pem") {
		t.Fatalf("standby: an identity left under the old root: %s; want the way out", msg)
	}
	// Break-glass signs with the store's admin intermediate, now under the
	// new root, and the identity it writes works.
	carol := filepath.Join(t.TempDir(), "carol.pem")
	mustRun(t, "admin", "add", "carol", "--offline", "--data", dir, "--out", carol)
	if out := mustRun(t, "status", "--identity", carol, "--authority", e.auth.addr); !strings.Contains(out, "/admin/carol") {
		t.Fatalf("standby: the break-glass identity: %s", out)
	}
	step("rollback", "update_servers")
	joinBoth("update_servers after a rollback from standby")
	step("next-phase", "standby")
	if msg := mustFail(t, "ca", "root", "next-phase", "--data", dir); !strings.Contains(msg, "no root rotation in progress") {
		t.Fatalf("next-phase from standby: %s", msg)
	}

	var recs []struct {
		Action string `json:"action"`
		Target string `json:"target"`
		Result string `json:"result"`
	}
	out := mustRun(t, "audit", "list", "--data", dir, "--action", "ca.root_phase", "-o", "json")
	if err := json.Unmarshal([]byte(out), &recs); err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	for _, r := range recs {
		targets[r.Target+" "+r.Result] = true
	}
	for _, want := range []string{"init->none ok", "init->update_agents ok", "update_agents->init ok", "update_servers->update_agents ok",
		"update_servers->standby ok", "standby->update_servers ok", "none->? denied", "standby->? denied"} {
		if !targets[want] {
			t.Errorf("no ca.root_phase record %q in %v", want, targets)
		}
	}
	out = mustRun(t, "audit", "list", "--data", dir, "--action", "ca.root_rotate", "-o", "json")
	if !strings.Contains(out, newFP) || !strings.Contains(out, abandoned) {
		t.Errorf("ca.root_rotate records do not name both new roots:\n%s", out)
	}
}

// TestRootRotationOfflineRootKey: with the root key taken out of the data
// directory, rotate refuses naming --root-key; with --root-key the file is
// read by the CLI, which certifies the new root the authority made, and
// the rotation starts; a file that is not the root's key is refused, as
// is one other users may read. A rollback to update_agents, which needs
// the old root's key on the authority, is refused saying so.
func TestRootRotationOfflineRootKey(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	offline := filepath.Join(t.TempDir(), "root.key")
	if err := os.Rename(filepath.Join(dir, "ca", "root.key"), offline); err != nil {
		t.Fatal(err)
	}
	startAuthority(t, dir)
	if msg := mustFail(t, "ca", "root", "rotate", "--data", dir); !strings.Contains(msg, "--root-key FILE") {
		t.Fatalf("rotate without the root key: %s", msg)
	}
	wrong := filepath.Join(dir, "ca", "agent.key")
	if msg := mustFail(t, "ca", "root", "rotate", "--data", dir, "--root-key", wrong); !strings.Contains(msg, "is not the key of the current root") {
		t.Fatalf("rotate with another key: %s", msg)
	}
	if err := os.Chmod(offline, 0o644); err != nil {
		t.Fatal(err)
	}
	if msg := mustFail(t, "ca", "root", "rotate", "--data", dir, "--root-key", offline); !strings.Contains(msg, "chmod 600") {
		t.Fatalf("rotate with a key file others may read: %s", msg)
	}
	if err := os.Chmod(offline, 0o600); err != nil {
		t.Fatal(err)
	}
	st := caRoot(t, dir, "rotate", "--root-key", offline)
	if st.Phase != "init" || st.NewRoot == nil || len(st.CrossCertificates) != 2 {
		t.Fatalf("rotate --root-key: %+v", st)
	}
	caRoot(t, dir, "next-phase")
	caRoot(t, dir, "next-phase")
	if msg := mustFail(t, "ca", "root", "rollback", "--data", dir); !strings.Contains(msg, "does not hold its key") {
		t.Fatalf("rollback to update_agents without the old root key: %s", msg)
	}
}
