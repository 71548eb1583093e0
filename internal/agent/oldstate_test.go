package agent

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/muster-dev/muster/internal/signer"
)

// testdata/v23 is the state.json and agent.yaml a token agent of schema
// 23's release (593c58a) wrote, taken from an upgrade walk: joined, renewed
// six times, a task and a signer rotation taken. The agent of this version
// must read them (an upgrade does not touch the directory), and what it
// writes back must keep every key the old agent wrote, so that the old
// binary put back (a rollback) finds what it reads: docs/install.md,
// "Upgrades", promises both.
func TestReadsAnOldAgentsState(t *testing.T) {
	d := Dir(t.TempDir())
	for _, name := range []string{"state.json", "agent.yaml"} {
		b, err := os.ReadFile(filepath.Join("testdata", "v23", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(string(d), name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	st, err := d.ReadState()
	if err != nil {
		t.Fatal(err)
	}
	if st.NodeID != "node5" || st.InstanceID == "" || st.TrustDomain == "" || st.Generation != 6 ||
		st.JoinMethod != "token" || st.LastRenewal == nil || st.NotAfter.IsZero() || st.Serial == "" ||
		len(st.VerifierSet) == 0 || len(st.RecentTasks) != 2 || st.LastRotateTask == "" || st.TrustBundle == "" {
		t.Errorf("ReadState of the old state.json lost a field: %+v", st)
	}
	if _, err := signer.NewTrust(st.VerifierSet, st.StagedVerifiers); err != nil {
		t.Errorf("the old state's verifier set: %v", err)
	}
	cfg, err := d.ReadConfig()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Authority == "" || cfg.Node != "node5" || cfg.JoinMethod != "token" || cfg.CAFingerprint == "" {
		t.Errorf("ReadConfig of the old agent.yaml: %+v", cfg)
	}

	old := jsonKeys(t, filepath.Join("testdata", "v23", "state.json"))
	if err := d.writeState(st); err != nil {
		t.Fatal(err)
	}
	if err := d.WriteConfig(cfg); err != nil {
		t.Fatal(err)
	}
	now := jsonKeys(t, d.StateFile())
	for _, k := range old {
		if !slices.Contains(now, k) {
			t.Errorf("state.json written back lacks %q, which the old agent wrote and reads", k)
		}
	}
	back, err := os.ReadFile(d.ConfigFile())
	if err != nil {
		t.Fatal(err)
	}
	was, err := os.ReadFile(filepath.Join("testdata", "v23", "agent.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// The old agent refuses an agent.yaml key it does not know.
	if string(back) != string(was) {
		t.Errorf("agent.yaml written back:\n%s\nwant the old agent's:\n%s", back, was)
	}
}

// jsonKeys is the top-level keys of the JSON object in file, sorted.
func jsonKeys(t *testing.T, file string) []string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return slices.Sorted(maps.Keys(m))
}
