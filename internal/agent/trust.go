package agent

import (
	"context"
	"fmt"

	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/signer"
	"github.com/muster-dev/muster/internal/spiffeid"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// StaticVerifiersEnv names the transition list of task verifiers: base64url
// Ed25519 public keys separated by commas or spaces. An agent with it runs
// on a static list besides its verifier set, and says so in its status.
const StaticVerifiersEnv = "MUSTER_TASK_SIGNING_PUBKEYS"

// trustOf is the agent's trust as state.json records it, with the static
// list of its options.
func (a *Agent) trustOf(st *State) (*signer.Trust, error) {
	var raw []byte
	if len(st.VerifierSet) > 0 {
		raw = st.VerifierSet
	}
	t, err := signer.NewTrust(raw, st.StagedVerifiers)
	if err != nil {
		return nil, fmt.Errorf("state.json verifier set: %w", err)
	}
	if a.staticVerifiers != "" {
		keys, err := signer.ParseStaticKeys(a.staticVerifiers)
		if err != nil {
			return nil, err
		}
		t.SetStatic(keys)
	}
	return t, nil
}

// takeVerifierSet records a verifier set an answer of the authority
// carried. At a join (first) the set comes over the channel pinned to the
// root and replaces whatever was held; later it must pass Trust.Accept. A
// set that does not pass is logged and ignored: the agent keeps the set it
// has, and nothing else of the answer depends on it.
func (a *Agent) takeVerifierSet(st *State, raw []byte, first bool) {
	if len(raw) == 0 {
		return
	}
	if first {
		st.VerifierSet, st.StagedVerifiers = nil, nil
	}
	t, err := a.trustOf(st)
	if err == nil {
		err = t.Accept(raw, a.now())
	}
	if err != nil {
		a.log.Warn("verifier set not taken", "err", err)
		a.metrics.verifierSet(0, err)
		return
	}
	st.VerifierSet, st.StagedVerifiers = t.Raw(), t.Pending()
	a.metrics.verifierSet(t.Version(), nil)
}

// RefreshTrust asks the authority, over mTLS, for its current verifier set
// and takes it by the same rule as a renewal's: the repair path of muster
// agent trust refresh. It returns the version held afterwards.
func (a *Agent) RefreshTrust(ctx context.Context) (int64, error) {
	unlock, err := a.dir.lock(ctx)
	if err != nil {
		return 0, err
	}
	defer unlock()
	st, id, err := a.load(true)
	if err != nil {
		return 0, err
	}
	authorityID, err := spiffeid.New(st.TrustDomain, spiffeid.RoleAuthority, st.AuthorityID)
	if err != nil {
		return 0, fmt.Errorf("state.json: %w", err)
	}
	conn, err := dial(a.address(st), identity.ClientTLS(id, id.RootPool(), identity.MatchID(authorityID)))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	resp, err := musterv1.NewAgentServiceClient(conn).GetVerifierSet(cctx, &musterv1.GetVerifierSetRequest{})
	if err != nil {
		return 0, err
	}
	t, err := a.trustOf(st)
	if err != nil {
		return 0, err
	}
	before := t.Version()
	switch err := t.Accept(resp.GetVerifierSet(), a.now()); {
	case err == nil:
	case before > 0 && err == signer.ErrSetStale:
		// Nothing newer: what the agent holds is current.
		return before, nil
	default:
		return 0, err
	}
	st.VerifierSet, st.StagedVerifiers = t.Raw(), t.Pending()
	if err := a.dir.writeState(st); err != nil {
		return 0, err
	}
	a.metrics.verifierSet(t.Version(), nil)
	a.log.Info("verifier set refreshed", "from_version", before, "version", t.Version())
	return t.Version(), nil
}
