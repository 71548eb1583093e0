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
		_, err = a.catchUp(ctx, conn, t)
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
// stopped. It returns the trust bundle of the last answer (nil if none
// came).
func (a *Agent) catchUp(ctx context.Context, conn grpc.ClientConnInterface, t *signer.Trust) (*musterv1.TrustBundle, error) {
	client := musterv1.NewAgentServiceClient(conn)
	for {
		have := t.Version()
		cctx, cancel := context.WithTimeout(ctx, a.timeout)
		resp, err := client.GetVerifierSet(cctx, &musterv1.GetVerifierSetRequest{HaveVersion: have})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("asking for the verifier sets after version %d: %w", have, err)
		}
		if err := t.AcceptChain(resp.GetChain(), a.now()); err != nil {
			return resp.GetTrustBundle(), err
		}
		if len(resp.GetChain()) >= signer.MaxChain && t.Version() > have {
			continue
		}
		if err := t.Accept(resp.GetVerifierSet(), a.now()); err != nil && !errors.Is(err, signer.ErrSetStale) {
			return resp.GetTrustBundle(), err
		}
		return resp.GetTrustBundle(), nil
	}
}

// Refreshed is what muster agent trust refresh leaves the agent holding.
type Refreshed struct {
	// VerifierSetVersion is the verifier set version held afterwards.
	VerifierSetVersion int64
	// TrustBundle is the digest of the last trust bundle taken, and Roots
	// the roots trusted afterwards (certs/ca.crt).
	TrustBundle string
	Roots       int
}

// RefreshTrust asks the authority, over mTLS, for the verifier sets after
// the one it holds and the current trust bundle, and takes them by the
// rule of a renewal's (the bundle by trustbundle.Take's: a new root only
// through a cross-certificate from a root held): the repair path of muster
// agent trust refresh.
func (a *Agent) RefreshTrust(ctx context.Context) (Refreshed, error) {
	unlock, err := a.dir.lock(ctx)
	if err != nil {
		return Refreshed{}, err
	}
	defer unlock()
	st, id, err := a.load(true)
	if err != nil {
		return Refreshed{}, err
	}
	authorityID, err := spiffeid.New(st.TrustDomain, spiffeid.RoleAuthority, st.AuthorityID)
	if err != nil {
		return Refreshed{}, fmt.Errorf("state.json: %w", err)
	}
	conn, err := dial(a.address(st), identity.ClientTLS(id, id.RootPool(), identity.MatchID(authorityID)))
	if err != nil {
		return Refreshed{}, err
	}
	defer conn.Close()
	t, err := a.trustOf(st)
	if err != nil {
		return Refreshed{}, err
	}
	before, digest := t.Version(), st.TrustBundle
	bundle, err := a.catchUp(ctx, conn, t)
	changed := a.recordTrust(st, t, before, err)
	roots, berr := a.takeBundle(st, id, bundle)
	if berr != nil {
		return Refreshed{}, berr
	}
	if changed || st.TrustBundle != digest {
		if werr := a.dir.writeState(st); werr != nil {
			return Refreshed{}, werr
		}
	}
	out := Refreshed{VerifierSetVersion: t.Version(), TrustBundle: st.TrustBundle, Roots: len(roots)}
	if err != nil {
		return out, untrustedAuthorityHint(err, st, a.dir)
	}
	return out, nil
}
