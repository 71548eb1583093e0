package agent

import (
	"errors"
	"strings"
	"testing"

	"github.com/muster-dev/muster/internal/signer"
)

// TestRestoreHintOfABoundAgentResolves: the join a bound-keypair agent is
// told to make after its authority's store was restored past its signer
// names everything a bound-keypair join needs: pasted with no agent.yaml
// or MUSTER_* variables, it resolves to a join to the address the agent
// renews at, pinned to the root it trusts. Before, it named neither
// --authority nor --ca-fingerprint and was refused "no authority address".
func TestRestoreHintOfABoundAgentResolves(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	_, dir := boundJoined(t, f)
	st, err := dir.ReadState()
	if err != nil {
		t.Fatal(err)
	}
	trust, err := signer.NewTrust(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	msg := notFollowed(signer.ErrSetUntrusted, trust, nil, st, dir).Error()
	i := strings.Index(msg, "muster agent join ")
	cmd, _, ok := strings.Cut(msg[max(i, 0):], " (docs/")
	if i < 0 || !ok {
		t.Fatalf("the error names no join: %s", msg)
	}
	in := JoinInputs{Getenv: func(string) string { return "" }}
	flags := map[string]*string{"--data": new(string), "--node": &in.Node, "--bound-keypair": &in.BoundKeypair,
		"--authority": &in.Authority, "--ca-fingerprint": &in.CAFingerprint}
	args := strings.Fields(strings.TrimPrefix(cmd, "muster agent join "))
	for j := 0; j < len(args); j++ {
		if args[j] == "--force" {
			continue
		}
		p, known := flags[args[j]]
		if !known || j+1 == len(args) {
			t.Fatalf("%q in the join the error names: %s", args[j], cmd)
		}
		*p = args[j+1]
		j++
	}
	res, err := ResolveJoin(in)
	if err != nil {
		t.Fatalf("the join the error names (%s), pasted: %v", cmd, err)
	}
	if res.Request.Authority != st.Authority || res.Request.CAFingerprint != heldRootPin(dir) || res.Request.CAFingerprint == "" {
		t.Errorf("the join goes to %s pinned to %s; want %s, the held root %s", res.Request.Authority, res.Request.CAFingerprint, st.Authority, heldRootPin(dir))
	}
	if !errors.Is(notFollowed(signer.ErrSetUntrusted, trust, nil, st, dir), signer.ErrSetUntrusted) {
		t.Error("the refusal's cause is lost")
	}
}

// TestRestoreHintOfABoundAgentWithoutTheStateAddress: a state from before
// the authority's address was recorded in it: the join named after a
// restored store takes the address agent.yaml kept from the join, as the
// untrusted root's hint does (rejoinTarget), not the ADDR placeholder.
func TestRestoreHintOfABoundAgentWithoutTheStateAddress(t *testing.T) {
	dir := Dir(t.TempDir())
	if err := dir.WriteConfig(Config{Authority: "auth.example:7443"}); err != nil {
		t.Fatal(err)
	}
	st := &State{NodeID: "n1", BoundKeypair: "n1", JoinMethod: JoinMethodBoundKeypair}
	trust, err := signer.NewTrust(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	msg := notFollowed(signer.ErrSetUntrusted, trust, nil, st, dir).Error()
	if strings.Contains(msg, "ADDR") || !strings.Contains(msg, "--authority auth.example:7443 ") {
		t.Errorf("the join does not name agent.yaml's address: %s", msg)
	}
}
