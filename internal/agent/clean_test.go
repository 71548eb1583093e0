package agent

import (
	"os"
	"path/filepath"
	"testing"
)

// TestInterruptedJoinLeavesNothing: an agent killed during a join after
// writing its certificate files, before state.json, and any writer killed
// between writing a temporary file and renaming it, leave nothing the next
// command sees: the certificates and the temporary files are gone once it
// holds the directory, the pending key is kept for the retried join, and a
// joined agent's files stay.
func TestInterruptedJoinLeavesNothing(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	a, dir := joined(t, f)
	certs := map[string][]byte{}
	for _, p := range dir.certFiles() {
		certs[p], _ = os.ReadFile(p)
	}

	// A joined agent: only the temporary files go.
	tmps := []string{
		filepath.Join(string(dir), ".state.json.tmp-123"),
		filepath.Join(string(dir), "certs", ".agent.key.tmp-9"),
		filepath.Join(string(dir), "keys", ".pending.key.tmp-1"),
	}
	for _, p := range tmps {
		os.WriteFile(p, []byte("half"), 0o600)
	}
	if _, _, err := a.current(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, p := range tmps {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s outlived the next command", p)
		}
	}
	for p := range certs {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("a joined agent lost %s: %v", p, err)
		}
	}

	// Killed mid-join: certificates, a pending key, the state to record,
	// no state.json.
	st, err := dir.ReadState()
	if err != nil {
		t.Fatal(err)
	}
	if err := dir.writeNextState(nextState{State: st}); err != nil {
		t.Fatal(err)
	}
	os.Remove(dir.StateFile())
	os.WriteFile(dir.PendingKeyFile(), []byte("pending"), 0o600)
	os.WriteFile(tmps[0], []byte("half"), 0o600)
	unlock, err := dir.lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	unlock()
	for p := range certs {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left without state.json", p)
		}
	}
	if _, err := os.Stat(dir.nextStateFile()); !os.IsNotExist(err) {
		t.Errorf("state.next.json left without state.json: %v", err)
	}
	if _, err := os.Stat(tmps[0]); !os.IsNotExist(err) {
		t.Error("the temporary state file outlived the next command")
	}
	if _, err := os.Stat(dir.PendingKeyFile()); err != nil {
		t.Errorf("the pending key, needed by a retried join, was removed: %v", err)
	}
}
