package e2e

import (
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestTwoRestoresInARow walks the operator guide's restore twice, out of
// the happy order, under running agents: a backup T1 (muster store
// backup, serving), a lock, a JWT-SVID key rotation and renewals, a
// backup T2, a node deletion, another renewal of an agent that then goes
// offline; the store restored to T1 and re-applied as the refused start
// says, run on; then restored to T2 and re-applied again. After each: the
// online agent renews on the restored store, the locked node stays locked
// and its certificate on the CRL, the deleted node stays deleted, the
// audit chain verifies, and no JWT-SVID key ID the relying parties saw
// names another key. The certificates live the default 24 hours, so none
// expires during the walk however slow the machine (the locked node's
// stays valid, and the CRL must name it); the agents renew when sent
// node.renew_now.
//
// The second reapply, from the store the first restore left, cannot
// work: that store's chain parted from T2's at the first restore. It
// refuses naming the store the first restore kept aside (which the
// operator guide's step 1 now moves out of the way instead of
// overwriting) and what cannot be re-applied; before, it said the store
// given was the wrong one and to give the one in use when the restore
// replaced it, which it was. Re-applied from the first store kept aside,
// the deletion and the offline agent's certificate of after T2 come
// back; the agent that renewed only on the abandoned chain names its way
// out, and the offline agent, whose certificate was carried, renews.
func TestTwoRestoresInARow(t *testing.T) {
	t.Parallel()
	crlAddr := freePort(t)
	args := []string{"--crl-listen", crlAddr, "--crl-url", "http://" + crlAddr}
	e := newAgentEnv(t, args...)
	args = append(args, "--listen", e.auth.addr)
	restart := func() { e.auth = startAuthority(t, e.dir, args...) }

	w := &restoreWalk{t: t, e: e, crl: crlAddr, kids: map[string]string{}}
	on, locked, gone, away := w.agent("on-1"), w.agent("locked-1"), w.agent("gone-1"), w.agent("away-1")
	for _, a := range []*walkAgent{on, locked, gone, away} {
		a.start()
	}
	w.renewNow(on)
	w.jwks()

	t1 := filepath.Join(t.TempDir(), "t1.db")
	mustRun(t, "store", "backup", "--data", e.dir, "--out", t1)
	lock := w.lock("locked-1")
	mustRun(t, "ca", "rotate", "jwt", "--data", e.dir)
	w.jwks()
	w.renewNow(on, away)
	t2 := filepath.Join(t.TempDir(), "t2.db")
	mustRun(t, "store", "backup", "--data", e.dir, "--out", t2)
	mustRun(t, "agents", "delete", "gone-1", "--data", e.dir)
	// The offline agent's last certificate is of after T2: only a
	// store kept aside knows it.
	w.renewNow(away)
	away.stop()
	w.jwks()

	w.restore(t1, restart)
	w.check(on, locked, lock)
	mustRun(t, "ca", "rotate", "jwt", "--data", e.dir)
	w.jwks()
	w.renewNow(on)

	// The second restore: the store kept aside now was itself restored
	// and re-applied; the backup T2 was taken on the chain the first
	// restore replaced. Its reapply refuses, naming the store the first
	// restore kept aside (moved out of the way as the operator guide
	// says, not overwritten) and what cannot be re-applied.
	refusal := w.restore(t2, nil)
	for _, want := range []string{"itself restored from an older backup", "give that store as --from", "--action store.backup"} {
		if !strings.Contains(refusal, want) {
			t.Errorf("the second restore's reapply refused without %q: %s", want, refusal)
		}
	}
	// The operator guide's command, pasted.
	from := exec.Command("sh", "-c", `"$0" store reapply --offline --data "$1" --from "sqlite://$(ls -t "$1"/muster.db.before-restore.?????? | head -n 1)" --apply`, musterBin, e.dir)
	out, err := from.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "delete node gone-1") || !strings.Contains(string(out), "carry node away-1") {
		t.Fatalf("the second restore re-applied from the store the first kept aside: %v\n%s", err, out)
	}
	restart()
	w.check(nil, locked, lock)
	w.jwks()

	// on-1 renewed only on the chain the second restore abandoned: told
	// to renew, it is refused and its agent names the way out.
	mustRun(t, "task", "send", "--type", "node.renew_now", "--node", on.node, "--data", e.dir)
	waitFor(t, 90*time.Second, "on-1 names the way out", func() bool { return strings.Contains(on.p.Logs(), "muster agent join --force --data "+on.dir) })
	// away-1 slept through both restores: its certificate of after T2
	// was carried by the reapply from the store the first restore kept
	// aside, and it renews.
	away.start()
	w.renewNow(away)
	if out := mustRun(t, "audit", "verify", "--data", e.dir); !strings.Contains(out, "intact") {
		t.Errorf("audit verify at the end: %s", out)
	}
}

// restoreWalk is the state of a walk through restores: the authority,
// its CRL listener and every JWT-SVID key ID its JWKS published, with its
// key (JSON of the public key).
type restoreWalk struct {
	t    *testing.T
	e    *agentEnv
	crl  string
	kids map[string]string
	n    int
}

// walkAgent is an agent of the walk, its process running or not.
type walkAgent struct {
	w    *restoreWalk
	node string
	dir  string
	p    *proc
}

func (w *restoreWalk) agent(node string) *walkAgent {
	return &walkAgent{w: w, node: node, dir: joinAgent(w.t, w.e, node)}
}

func (a *walkAgent) start() {
	a.w.t.Helper()
	a.p, _ = startProc(a.w.t, a.node, "agent started", "agent", "run", "--data", a.dir, "--log-format", "json")
}

func (a *walkAgent) stop() { a.p.stop(a.w.t) }

// renewNow sends agents node.renew_now (muster task send) and waits for
// each one's renewal.
func (w *restoreWalk) renewNow(agents ...*walkAgent) {
	w.t.Helper()
	send := []string{"task", "send", "--type", "node.renew_now", "--data", w.e.dir}
	for _, a := range agents {
		send = append(send, "--node", a.node)
	}
	renewedAfter(w.t, func() { mustRun(w.t, send...) }, agents...)
}

// renewedAll waits for each of agents' next renewal, together.
func renewedAll(t *testing.T, agents ...*walkAgent) {
	t.Helper()
	renewedAfter(t, func() {}, agents...)
}

// renewedAfter waits for each of agents' next renewal after then has run
// (it may make them renew), together.
func renewedAfter(t *testing.T, then func(), agents ...*walkAgent) {
	t.Helper()
	before := map[*walkAgent]string{}
	for _, a := range agents {
		s, err := readAgentState(a.dir)
		if err != nil {
			t.Fatal(err)
		}
		before[a] = s
	}
	then()
	for _, a := range agents {
		waitFor(t, 90*time.Second, a.node+" renews", func() bool {
			st, err := readAgentState(a.dir)
			return err == nil && st != before[a]
		})
	}
}

// readAgentState is the agent's serial, without failing while it
// rewrites its state.
func readAgentState(adir string) (string, error) {
	var st struct {
		Serial string `json:"serial"`
	}
	b, err := os.ReadFile(filepath.Join(adir, "state.json"))
	if err == nil {
		err = json.Unmarshal(b, &st)
	}
	return st.Serial, err
}

func (w *restoreWalk) lock(node string) string {
	w.t.Helper()
	var lock map[string]any
	if err := json.Unmarshal([]byte(mustRun(w.t, "lock", "create", "--node", node, "--reason", "laptop stolen", "--data", w.e.dir, "-o", "json")), &lock); err != nil {
		w.t.Fatal(err)
	}
	return lock["id"].(string)
}

// jwks fetches the JWKS relying parties read and fails the test if a key
// ID it publishes named another key before.
func (w *restoreWalk) jwks() {
	w.t.Helper()
	var body []byte
	waitFor(w.t, time.Minute, "the JWKS is served", func() bool {
		resp, err := http.Get("http://" + w.crl + "/.well-known/jwks.json")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ = io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK
	})
	var set struct {
		Keys []map[string]any `json:"keys"`
	}
	if err := json.Unmarshal(body, &set); err != nil {
		w.t.Fatalf("the JWKS: %v\n%s", err, body)
	}
	for _, k := range set.Keys {
		kid, _ := k["kid"].(string)
		key := fmt.Sprint(k["x"], k["y"])
		if was, ok := w.kids[kid]; ok && was != key {
			w.t.Errorf("JWT-SVID key ID %s names another key than before", kid)
		}
		w.kids[kid] = key
	}
}

// restore stops the authority and restores backup as the operator guide
// says: the store in use moved aside, the refused start's way out and
// the store reapply it names pasted, then --apply; restart starts the
// authority again. It returns what --apply printed; with restart nil,
// the reapply's refusal (the test fails if it is not refused).
func (w *restoreWalk) restore(backup string, restart func()) (refusal string) {
	t, dir := w.t, w.e.dir
	t.Helper()
	w.n++
	w.e.auth.stop(t)
	// The operator guide's step 1, pasted.
	step := `cd "$0" && if [ -e muster.db.before-restore ]; then d=$(mktemp -u muster.db.before-restore.XXXXXX) && for s in "" -wal -shm; do [ ! -e "muster.db.before-restore$s" ] || mv "muster.db.before-restore$s" "$d$s"; done; fi
for s in "" -wal -shm; do [ ! -e "muster.db$s" ] || mv "muster.db$s" "muster.db.before-restore$s"; done
install -m 0600 "$1" muster.db`
	if out, err := exec.Command("sh", "-c", step, dir, backup).CombinedOutput(); err != nil {
		t.Fatalf("restore %d: step 1: %v\n%s", w.n, err, out)
	}
	r := muster(t, nil, "authority", "--data", dir, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0")
	const lead = "kept as the evidence of what it removed: "
	_, mv, ok := strings.Cut(strings.TrimSpace(r.stderr), lead)
	if r.code == 0 || !ok {
		t.Fatalf("restore %d: the authority on the restored store: exit %d, stderr %s; want the way out", w.n, r.code, r.stderr)
	}
	if out, err := exec.Command("sh", "-c", mv).CombinedOutput(); err != nil {
		t.Fatalf("restore %d: the way out %q pasted: %v: %s", w.n, mv, err, out)
	}
	_, named, _ := strings.Cut(r.stderr, "once these files are moved aside, ")
	named, _, _ = strings.Cut(named, " prints what it re-applies")
	paste := func(cmd string) (string, error) {
		sh := exec.Command("sh", "-c", cmd)
		sh.Env = []string{"PATH=" + filepath.Dir(musterBin) + ":" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
		out, err := sh.CombinedOutput()
		return string(out), err
	}
	out, err := paste(named)
	if restart == nil {
		if err == nil {
			t.Fatalf("restore %d: %q pasted: succeeded, want a refusal\n%s", w.n, named, out)
		}
		return out
	}
	if err != nil {
		t.Fatalf("restore %d: %q pasted: %v\n%s", w.n, named, err, out)
	}
	if out, err = paste(named + " --apply"); err != nil {
		t.Fatalf("restore %d: %q pasted: %v\n%s", w.n, named+" --apply", err, out)
	}
	t.Logf("restore %d: applied:\n%s", w.n, out)
	restart()
	return out
}

// check waits for on to renew on the restored store, and checks the
// lock is in force (and the CRL names locked's certificate), no deleted
// node is back and the audit chain verifies.
func (w *restoreWalk) check(on, locked *walkAgent, lock string) {
	t := w.t
	t.Helper()
	if on != nil {
		w.renewNow(on)
	}
	if out := mustRun(t, "lock", "list", "--data", w.e.dir); !strings.Contains(out, lock) {
		t.Errorf("restore %d: the lock %s is not in force:\n%s", w.n, lock, out)
	}
	if out := mustRun(t, "agents", "list", "--data", w.e.dir); strings.Contains(out, "gone-1") {
		t.Errorf("restore %d: the deleted node is back:\n%s", w.n, out)
	}
	certs := readCerts(t, filepath.Join(locked.dir, "certs", "agent.crt"))
	leaf, inter := certs[0], certs[1]
	url := "http://" + w.crl + "/crl/agent-" + inter.SerialNumber.Text(16) + ".crl"
	var rl *x509.RevocationList
	waitFor(t, time.Minute, "the CRL is served", func() bool {
		resp, err := crlClient.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	rl, _ = fetchCRL(t, url, inter)
	// A list names only certificates not yet expired: the walk's
	// certificates outlive it, so the check is always made.
	if !time.Now().Before(leaf.NotAfter) {
		t.Fatalf("restore %d: the locked node's certificate %s expired at %s: the CRL cannot be checked", w.n, leaf.SerialNumber.Text(16), leaf.NotAfter)
	}
	if !slices.ContainsFunc(rl.RevokedCertificateEntries, func(r x509.RevocationListEntry) bool { return r.SerialNumber.Cmp(leaf.SerialNumber) == 0 }) {
		t.Errorf("restore %d: the CRL lacks the locked node's certificate %s", w.n, leaf.SerialNumber.Text(16))
	}
	if out := mustRun(t, "audit", "verify", "--data", w.e.dir); !strings.Contains(out, "intact") {
		t.Errorf("restore %d: audit verify: %s", w.n, out)
	}
}
