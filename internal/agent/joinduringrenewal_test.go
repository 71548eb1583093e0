package agent

import (
	"os"
	"strings"
	"testing"

	"github.com/muster-dev/muster/internal/shellword"
)

// A renewal in flight while a forced join (agent join --force, another
// process) stops after writing its certificate and before state.json
// finds, on its re-read under the lock, the join's state.next.json. It
// must finish that join as the next start would: agent.yaml naming the
// join's authority and pin, and state.next.json gone. Before, the
// renewal wrote the join's state into state.json and nothing else, so
// the next start, finding state.json matching the certificate, dropped
// state.next.json and left agent.yaml naming the old authority and pin
// beside the new certificate for good.
func TestRenewalFinishesAJoinInterruptedWhileInFlight(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	a, dir := joined(t, f)
	old, err := dir.ReadState()
	if err != nil {
		t.Fatal(err)
	}
	old.InstanceID = "instance-0"
	if err := dir.writeState(old); err != nil {
		t.Fatal(err)
	}
	oldCfg, err := dir.ReadConfig()
	if err != nil {
		t.Fatal(err)
	}
	oldCfg.Authority = "old-authority.example:7443"
	oldCfg.CAFingerprint = "sha256:" + strings.Repeat("0f", 32)
	if err := dir.WriteConfig(oldCfg); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	hold, held := make(chan struct{}), make(chan struct{}, 1)
	f.renewHold, f.renewHeld = hold, held
	f.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		_, err := a.Renew(t.Context())
		done <- err
	}()
	select {
	case <-held:
	case err := <-done:
		t.Fatalf("the renewal ended before its request: %v", err)
	}
	r := f.joinRequest("n1")
	r.Force = true
	crashJoinAt(t, newTestAgent(t, dir), r, "identity")
	close(hold)
	if err := <-done; err != nil {
		t.Fatalf("renewal: %v", err)
	}
	if _, err := os.Stat(dir.nextStateFile()); !os.IsNotExist(err) {
		t.Errorf("state.next.json after the renewal: %v", err)
	}
	if _, _, err := newTestAgent(t, dir).current(t.Context()); err != nil {
		t.Fatalf("start after the renewal: %v", err)
	}
	cfg, err := dir.ReadConfig()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Authority != f.addr || cfg.CAFingerprint != f.h.Fingerprint() {
		t.Errorf("agent.yaml after the renewal and a start: authority %s, pin %s; want the join's %s, %s",
			cfg.Authority, cfg.CAFingerprint, f.addr, f.h.Fingerprint())
	}
	st, err := dir.ReadState()
	if err != nil {
		t.Fatal(err)
	}
	if st.InstanceID != "instance-1" {
		t.Errorf("state.json instance %s after the renewal, want the join's instance-1", st.InstanceID)
	}
}

// A state.next.json left over that does not describe the certificate on
// disk (its serial is another's: a join that finished, or stopped before
// its certificate) is dropped at the next start, its agent.yaml part
// (discovery settings among them) not applied: only the state of the
// certificate on disk is ever taken from it.
func TestLeftoverNextStateNotApplied(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	_, dir := joined(t, f)
	before, err := dir.ReadConfig()
	if err != nil {
		t.Fatal(err)
	}
	st, err := dir.ReadState()
	if err != nil {
		t.Fatal(err)
	}
	stale := *st
	stale.Serial, stale.InstanceID = "0badc0de", "instance-stale"
	if err := dir.writeNextState(nextState{State: &stale, Config: &joinConfig{Authority: "stale.example:7443", Node: "n1", JoinMethod: "psk",
		CAFingerprint: "sha256:" + strings.Repeat("0f", 32), Discovery: "disc.example:8443", AuthorityID: "stale-authority"}}); err != nil {
		t.Fatal(err)
	}
	got, _, err := newTestAgent(t, dir).current(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got.InstanceID != st.InstanceID {
		t.Errorf("state after the start: instance %s, want %s", got.InstanceID, st.InstanceID)
	}
	cfg, err := dir.ReadConfig()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Authority != before.Authority || cfg.Discovery != before.Discovery || cfg.AuthorityID != before.AuthorityID || cfg.CAFingerprint != before.CAFingerprint {
		t.Errorf("agent.yaml after the start: %+v, want it unchanged: %+v", cfg, before)
	}
	if _, err := os.Stat(dir.nextStateFile()); !os.IsNotExist(err) {
		t.Errorf("state.next.json after the start: %v", err)
	}
}

// A state.next.json that cannot be read, beside a certificate state.json
// does not record, is refused with the way out (a join again over the
// identity), not taken as a renewal's certificate: that wrote the old
// instance's state beside what may be a forced join's certificate. With
// the certificate state.json records, the file says nothing about it.
func TestDamagedNextStateBesideANewCertificateRefused(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	_, dir := joined(t, f)
	st, err := dir.ReadState()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir.nextStateFile(), []byte(`{"state": {"node_id": "n1", "ser`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := newTestAgent(t, dir).current(t.Context()); err != nil {
		t.Fatalf("start with the certificate state.json records: %v", err)
	}
	older := *st
	older.Serial, older.InstanceID = "0badc0de", "instance-old"
	if err := dir.writeState(&older); err != nil {
		t.Fatal(err)
	}
	_, _, err = newTestAgent(t, dir).current(t.Context())
	want := "muster agent join --force --data " + shellword.Quote(string(dir)) + " --node " + st.NodeID
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "state.next.json") {
		t.Fatalf("start with a damaged state.next.json beside a new certificate: %v, want a refusal naming the file and %q", err, want)
	}
	got, err := dir.ReadState()
	if err != nil {
		t.Fatal(err)
	}
	if got.Serial != older.Serial || got.InstanceID != older.InstanceID {
		t.Errorf("state.json after the refusal: %+v, want it unchanged: %+v", got, older)
	}
}
