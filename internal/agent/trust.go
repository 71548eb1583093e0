package agent

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"

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
// root and replaces whatever was held; later it must pass Trust.Accept.
// A set the agent cannot take directly (it missed the steps between, so
// the signer is not one it holds) is caught up through the chain of sets
// the authority kept, asked over conn, the channel that brought the set
// (mTLS, the authority's identity checked); nil conn asks nothing. A set
// that still does not pass is logged and ignored: the agent keeps the set
// it has, and nothing else of the answer depends on it. It reports whether
// the held set changed.
func (a *Agent) takeVerifierSet(ctx context.Context, st *State, raw []byte, first bool, conn grpc.ClientConnInterface) bool {
	if len(raw) == 0 {
		return false
	}
	if first {
		st.VerifierSet, st.StagedVerifiers = nil, nil
	}
	t, err := a.trustOf(st)
	if err != nil {
		a.log.Warn("verifier set not taken", "err", err)
		a.metrics.verifierSet(0, err)
		return false
	}
	before := t.Version()
	err = t.Accept(raw, a.now())
	if err != nil && !errors.Is(err, signer.ErrSetStale) && conn != nil {
		err = a.catchUp(ctx, conn, t)
	}
	return a.recordTrust(st, t, before, err)
}

// recordTrust puts what t holds into st after an attempt to take a set
// that ended with err, logs and counts it, and reports whether the held
// set changed.
func (a *Agent) recordTrust(st *State, t *signer.Trust, before int64, err error) bool {
	changed := t.Version() != before
	if changed {
		st.VerifierSet, st.StagedVerifiers = t.Raw(), t.Pending()
		a.metrics.verifierSet(t.Version(), nil)
		a.log.Info("verifier set taken", "from_version", before, "version", t.Version())
		select {
		case a.trustChanged <- struct{}{}:
		default:
		}
	}
	switch {
	case err == nil:
	case errors.Is(err, signer.ErrSetStale):
		// The normal case: every stream open and renewal carries the
		// set the agent already holds.
		a.log.Debug("verifier set not taken: not newer", "version", t.Version())
	default:
		a.log.Warn("verifier set not taken", "err", err, "version", t.Version())
		a.metrics.verifierSet(0, err)
	}
	return changed
}

// catchUp asks the authority over conn for the chain of sets after the
// one t holds and takes them in turn (Trust.AcceptChain), then the current
// set. A chain cut at signer.MaxChain is asked for again from where it
// stopped.
func (a *Agent) catchUp(ctx context.Context, conn grpc.ClientConnInterface, t *signer.Trust) error {
	client := musterv1.NewAgentServiceClient(conn)
	for {
		have := t.Version()
		cctx, cancel := context.WithTimeout(ctx, a.timeout)
		resp, err := client.GetVerifierSet(cctx, &musterv1.GetVerifierSetRequest{HaveVersion: have})
		cancel()
		if err != nil {
			return fmt.Errorf("asking for the verifier sets after version %d: %w", have, err)
		}
		if err := t.AcceptChain(resp.GetChain(), a.now()); err != nil {
			return err
		}
		if len(resp.GetChain()) >= signer.MaxChain && t.Version() > have {
			continue
		}
		if err := t.Accept(resp.GetVerifierSet(), a.now()); err != nil && !errors.Is(err, signer.ErrSetStale) {
			return err
		}
		return nil
	}
}

// RefreshTrust asks the authority, over mTLS, for the verifier sets after
// the one it holds and takes them by the rule of a renewal's: the repair
// path of muster agent trust refresh. It returns the version held
// afterwards.
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
	t, err := a.trustOf(st)
	if err != nil {
		return 0, err
	}
	before := t.Version()
	err = a.catchUp(ctx, conn, t)
	if a.recordTrust(st, t, before, err) {
		if werr := a.dir.writeState(st); werr != nil {
			return 0, werr
		}
	}
	if err != nil {
		return t.Version(), err
	}
	return t.Version(), nil
}
