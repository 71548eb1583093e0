package agent

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/identity"
)

// errCrash stops a join at a step, as a crash there would.
type errCrash string

// A join stopped after any of its writes leaves what the next start
// finishes: before state.json, a join that can be retried with the
// secret still in agent.yaml; after it, agent.yaml naming the authority,
// the node and the pin, no secret, and no pending key equal to the
// certified one (which the next renewal would send again).
func TestJoinCrashAtEachStep(t *testing.T) {
	for _, c := range []struct {
		step   string
		joined bool // state.json written: the join has succeeded
	}{
		{"identity", false},
		{"config", false},
		{"state", true},
		{"pending", true},
	} {
		t.Run(c.step, func(t *testing.T) {
			f := newFakeAuthority(t, fakeOptions{})
			dir := Dir(filepath.Join(t.TempDir(), "agent"))
			if err := dir.WriteConfig(Config{Token: f.token.Reveal(), Node: "n1"}); err != nil {
				t.Fatal(err)
			}
			crashJoinAt(t, newTestAgent(t, dir), f.joinRequest("n1"), c.step)
			if dir.HasIdentity() != c.joined {
				t.Fatalf("state.json after a crash at %s: %v, want %v", c.step, dir.HasIdentity(), c.joined)
			}
			a := newTestAgent(t, dir)
			if !c.joined {
				// agent run joins again: it needs the secret.
				if cfg, err := dir.ReadConfig(); err != nil || cfg.Token != f.token.Reveal() {
					t.Fatalf("agent.yaml before the join succeeded: %+v, %v: the token is gone", cfg, err)
				}
				if _, err := a.Join(t.Context(), f.joinRequest("n1")); err != nil {
					t.Fatalf("join again after a crash at %s: %v", c.step, err)
				}
			} else if _, _, err := a.current(t.Context()); err != nil {
				t.Fatalf("load after a crash at %s: %v", c.step, err)
			}
			cfg, err := dir.ReadConfig()
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Token != "" || cfg.Authority != f.addr || cfg.Node != "n1" || cfg.JoinMethod != "token" || cfg.CAFingerprint != f.h.Fingerprint() {
				t.Errorf("agent.yaml after a crash at %s and a restart: %+v", c.step, cfg)
			}
			if _, err := os.Stat(dir.PendingKeyFile()); !os.IsNotExist(err) {
				t.Errorf("keys/pending.key after a crash at %s and a restart: %v", c.step, err)
			}
			_, id, key, err := a.renewStart(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if identity.SamePublicKey(key.Public(), id.Leaf().PublicKey) {
				t.Errorf("after a crash at %s the next renewal asks for the certified key again", c.step)
			}
		})
	}
}

// crashJoinAt runs a join that stops after step, as a crash would: no
// deferred clean-up of the join runs on its error path.
func crashJoinAt(t *testing.T, a *Agent, r JoinRequest, step string) {
	t.Helper()
	prev := joinStep
	t.Cleanup(func() { joinStep = prev })
	joinStep = func(s string) {
		if s == step {
			panic(errCrash(s))
		}
	}
	defer func() {
		joinStep = prev
		if p := recover(); p != errCrash(step) {
			t.Fatalf("the join did not stop at %s: %v", step, p)
		}
	}()
	a.Join(t.Context(), r)
}

// forcedJoinSteps are the steps of a forced join's writes a crash is
// tried at, in order, and whether the new certificate is on disk by then.
var forcedJoinSteps = []struct {
	step    string
	renewed bool // the new certificate is on disk
}{
	{"next-state", false},
	{"identity", true},
	{"config", true},
	{"state", true},
	{"pending", true},
}

// A join with --force over this node's identity stopped after any of its
// writes leaves, after the next start, a state.json that describes the
// certificate on disk: the new instance's ID, generation and serial once
// the new certificate is written, the old instance's whole before it; and
// an agent.yaml that names the authority and the pin the certificate
// came with: the new ones once it is written (the join was to another
// authority, or the same one moved and its root rotated), the old ones
// before. Before, a crash between the certificate and agent.yaml left
// the old address and pin beside the new certificate for good.
//
// The same holds for a state.next.json an agent before this one wrote,
// without agent.yaml's part and the trust bundle (oldFormat): the state
// and the roots written with the certificate say what agent.yaml is to.
// Before, such a file left the old agent.yaml in place.
func TestForcedJoinCrashAtEachStep(t *testing.T) {
	for _, oldFormat := range []bool{false, true} {
		for _, c := range forcedJoinSteps {
			name := c.step
			if oldFormat {
				name += ", old state.next.json"
			}
			t.Run(name, func(t *testing.T) { forcedJoinCrash(t, c.step, c.renewed, oldFormat) })
		}
	}
}

func forcedJoinCrash(t *testing.T, step string, renewed, oldFormat bool) {

	f := newFakeAuthority(t, fakeOptions{})
	_, dir := joined(t, f)
	// The old instance, renewed a few times.
	old, err := dir.ReadState()
	if err != nil {
		t.Fatal(err)
	}
	old.InstanceID, old.Generation = "instance-0", 5
	if err := dir.writeState(old); err != nil {
		t.Fatal(err)
	}
	// Joined before at another authority, by a PSK; a setting of
	// agent.yaml's own that every join keeps.
	oldCfg, err := dir.ReadConfig()
	if err != nil {
		t.Fatal(err)
	}
	oldCfg.Authority, oldCfg.JoinMethod = "old-authority.example:7443", "psk"
	oldCfg.CAFingerprint = "sha256:" + strings.Repeat("0f", 32)
	oldCfg.WorkloadAPI = &WorkloadAPIConfig{Listen: "unix:///run/muster/workload.sock"}
	if err := dir.WriteConfig(oldCfg); err != nil {
		t.Fatal(err)
	}
	r := f.joinRequest("n1")
	r.Force = true
	crashJoinAt(t, newTestAgent(t, dir), r, step)
	if oldFormat {
		stripNextState(t, dir)
	}
	st, id, err := newTestAgent(t, dir).current(t.Context())
	if err != nil {
		t.Fatalf("load after a crash at %s: %v", step, err)
	}
	want := old
	if renewed {
		want = &State{InstanceID: "instance-1", Generation: 0, Serial: serialOf(id)}
	}
	if st.InstanceID != want.InstanceID || st.Generation != want.Generation || st.Serial != serialOf(id) || st.Serial != want.Serial {
		t.Errorf("after a crash at %s: instance %s, generation %d, serial %s; want %s, %d, %s (the certificate's %s)",
			step, st.InstanceID, st.Generation, st.Serial, want.InstanceID, want.Generation, want.Serial, serialOf(id))
	}
	if onDisk, err := dir.ReadState(); err != nil || onDisk.InstanceID != st.InstanceID || onDisk.Serial != st.Serial {
		t.Errorf("state.json after a crash at %s and a load: %+v, %v", step, onDisk, err)
	}
	if _, err := os.Stat(dir.nextStateFile()); !os.IsNotExist(err) {
		t.Errorf("state.next.json after a crash at %s and a load: %v", step, err)
	}
	cfg, err := dir.ReadConfig()
	if err != nil {
		t.Fatal(err)
	}
	wantCfg := oldCfg
	if renewed {
		wantCfg.Authority, wantCfg.JoinMethod, wantCfg.CAFingerprint = f.addr, "token", f.h.Fingerprint()
	}
	if cfg.Authority != wantCfg.Authority || cfg.JoinMethod != wantCfg.JoinMethod || cfg.CAFingerprint != wantCfg.CAFingerprint ||
		cfg.Node != "n1" || cfg.WorkloadAPI == nil || cfg.WorkloadAPI.Listen != wantCfg.WorkloadAPI.Listen {
		t.Errorf("agent.yaml after a crash at %s and a load: authority %s, join method %s, pin %s, workload_api %+v; want %s, %s, %s, %+v",
			step, cfg.Authority, cfg.JoinMethod, cfg.CAFingerprint, cfg.WorkloadAPI,
			wantCfg.Authority, wantCfg.JoinMethod, wantCfg.CAFingerprint, wantCfg.WorkloadAPI)
	}
}

// stripNextState rewrites state.next.json, if there is one, as an agent
// before agent_yaml and trust_bundle were added wrote it.
func stripNextState(t *testing.T, dir Dir) {
	t.Helper()
	data, err := os.ReadFile(dir.nextStateFile())
	if os.IsNotExist(err) {
		return
	} else if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	delete(m, "agent_yaml")
	delete(m, "trust_bundle")
	if data, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir.nextStateFile(), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// A join with --force to another authority stopped after any of its
// writes leaves, after the next start, the trust bundle that goes with
// the certificate on disk: once the new certificate is written,
// certs/ca.crt, certs/bundle.pem and state.json's bundle digest are what
// the join had it not stopped writes, and no root of the old authority
// is left in them; before it, the old authority's, untouched. Before, a
// crash between the certificate and the bundle left certs/bundle.pem
// (which local relying parties take roots from) holding the old
// authority's roots and intermediates, and state.json no digest, until
// the new authority's next answer (a stream's push or a renewal) brought
// its bundle: an agent that could not reach it kept them.
func TestForcedJoinToAnotherAuthorityCrashAtEachStep(t *testing.T) {
	for _, c := range forcedJoinSteps {
		t.Run(c.step, func(t *testing.T) {
			oldAuth, newAuth := newFakeAuthority(t, fakeOptions{}), newFakeAuthority(t, fakeOptions{})
			forced := newAuth.joinRequest("n1")
			forced.Force = true

			// What the join writes when it does not stop.
			_, whole := joined(t, oldAuth)
			if _, err := newTestAgent(t, whole).Join(t.Context(), forced); err != nil {
				t.Fatal(err)
			}
			want := heldTrust(t, whole)

			_, dir := joined(t, oldAuth)
			old := heldTrust(t, dir)
			crashJoinAt(t, newTestAgent(t, dir), forced, c.step)
			if _, _, err := newTestAgent(t, dir).current(t.Context()); err != nil {
				t.Fatalf("load after a crash at %s: %v", c.step, err)
			}
			if !c.renewed {
				want = old
			}
			got := heldTrust(t, dir)
			if got.ca != want.ca {
				t.Errorf("after a crash at %s and a load: %s is not what the join writes", c.step, dir.CAFile())
			}
			if got.bundle != want.bundle {
				t.Errorf("after a crash at %s and a load: %s is not what the join writes", c.step, dir.BundleFile())
			}
			if got.digest != want.digest {
				t.Errorf("after a crash at %s and a load: state.json records trust bundle %q, want %q", c.step, got.digest, want.digest)
			}
			if c.renewed {
				bundle, err := os.ReadFile(dir.BundleFile())
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(string(bundle), string(ca.EncodeCertPEM(oldAuth.h.Root))) {
					t.Errorf("after a crash at %s and a load: %s still holds the old authority's root", c.step, dir.BundleFile())
				}
			}
		})
	}
}

// trust is what an agent directory trusts: certs/ca.crt, certs/bundle.pem,
// and the bundle's digest state.json records.
type trust struct {
	ca, bundle, digest string
}

func heldTrust(t *testing.T, dir Dir) trust {
	t.Helper()
	caPEM, err := os.ReadFile(dir.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	bundle, err := os.ReadFile(dir.BundleFile())
	if err != nil {
		t.Fatal(err)
	}
	st, err := dir.ReadState()
	if err != nil {
		t.Fatal(err)
	}
	return trust{ca: string(caPEM), bundle: string(bundle), digest: st.TrustBundle}
}
