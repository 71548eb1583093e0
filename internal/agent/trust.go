package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/shellword"
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
		_, _, err = a.catchUp(ctx, conn, t)
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
		wake(a.trustChanged)
	}
	switch {
	case err == nil:
	case errors.Is(err, signer.ErrSetStale):
		// The normal case: every stream open and renewal carries the
		// set the agent already holds.
		a.log.Debug("verifier set not taken: not newer", "version", t.Version())
	default:
		// A set the agent's does not lead to says how to get back, on
		// every stream open and renewal that brings it.
		a.log.Warn("verifier set not taken", "err", notFollowed(err, t, nil, st, a.dir), "version", t.Version())
		a.metrics.verifierSet(0, err)
	}
	return changed
}

// catchUp asks the authority over conn for the chain of sets after the
// one t holds and takes them in turn (Trust.AcceptChain), then the current
// set. A chain cut at signer.MaxChain is asked for again from where it
// stopped. It returns the trust bundle of the last answer (nil if none
// came) and the authority's current set as that answer carried it.
func (a *Agent) catchUp(ctx context.Context, conn grpc.ClientConnInterface, t *signer.Trust) (*musterv1.TrustBundle, []byte, error) {
	client := musterv1.NewAgentServiceClient(conn)
	for {
		have := t.Version()
		cctx, cancel := context.WithTimeout(ctx, a.timeout)
		resp, err := client.GetVerifierSet(cctx, &musterv1.GetVerifierSetRequest{HaveVersion: have})
		cancel()
		if err != nil {
			return nil, nil, fmt.Errorf("asking for the verifier sets after version %d: %w", have, err)
		}
		if err := t.AcceptChain(resp.GetChain(), a.now()); err != nil {
			return resp.GetTrustBundle(), resp.GetVerifierSet(), err
		}
		if len(resp.GetChain()) >= signer.MaxChain && t.Version() > have {
			continue
		}
		if err := t.Accept(resp.GetVerifierSet(), a.now()); err != nil && !errors.Is(err, signer.ErrSetStale) {
			return resp.GetTrustBundle(), resp.GetVerifierSet(), err
		}
		return resp.GetTrustBundle(), resp.GetVerifierSet(), nil
	}
}

// notFollowed is the error of an agent left, after a catch-up that ended
// with err, holding t while the authority's current set is current: nil
// when it holds that very set (or the authority sent none). A set the
// agent cannot take (not signed by a key it holds as active or staged,
// or giving one of its keys another public key), or one at or below the
// agent's version that is not the set the agent holds, means the
// authority's sets do not follow from the agent's: its store was restored
// from a backup. The authority moves past a set agents hold by itself
// when a key active or staged in both can sign (docs/signer-lifecycle.md,
// "Restoring the store"); where none can, only a join over the agent's
// identity brings it the authority's set again.
func notFollowed(err error, t *signer.Trust, current []byte, st *State, dir Dir) error {
	rejoin := fmt.Sprintf("join again: %s (docs/signer-lifecycle.md, \"Restoring the store\")", RejoinCommand(dir, st.NodeID))
	if st.JoinMethod == JoinMethodBoundKeypair {
		// A bound-keypair join needs the authority and the root's pin:
		// how the agent reaches the authority (rejoinTarget), and the
		// root it trusts now (a restored store keeps its root; the
		// authority's certificate chained to it to answer).
		rejoin = fmt.Sprintf("join again with the bound key: muster agent join --force --data %s --node %s --bound-keypair %s %s --ca-fingerprint %s (docs/signer-lifecycle.md, \"Restoring the store\")",
			shellword.Quote(string(dir)), st.NodeID, shellword.Quote(st.BoundKeypair), rejoinTarget(st, dir), heldRootPin(dir))
	}
	switch {
	case errors.Is(err, signer.ErrSetUntrusted), errors.Is(err, signer.ErrKeyConflict):
		return fmt.Errorf("%w: the authority's verifier sets do not follow from the one this agent holds (version %d): its store was restored from a backup taken before the signer this agent holds as active was staged, or it is another authority; %s",
			err, t.Version(), rejoin)
	case err != nil:
		return err
	case len(current) == 0 || bytes.Equal(current, t.Raw()):
		return nil
	}
	theirs, perr := signer.ParseVerifierSet(current)
	if perr != nil {
		return perr
	}
	if theirs.Version == t.Version() && sameKeys(theirs.Keys, t.Raw()) {
		return nil
	}
	if theirs.Version < t.Version() {
		return fmt.Errorf("the authority's verifier set (version %d) is behind the one this agent holds (version %d): its store was restored from a backup; it moves past the agent's set by itself within a minute or two of the agent's next heartbeat (muster agent run sends them) when a signer of the agent's set is still in its store; if this still fails after that, %s",
			theirs.Version, t.Version(), rejoin)
	}
	return fmt.Errorf("the authority's verifier set version %d is not the one this agent holds under that version: its store was restored from a backup and took other signer steps since; %s",
		theirs.Version, rejoin)
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
	bundle, current, err := a.catchUp(ctx, conn, t)
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
	if untrusted := (*identity.UntrustedRootError)(nil); errors.As(err, &untrusted) {
		return out, untrustedAuthorityHint(err, st, a.dir)
	}
	if err := notFollowed(err, t, current, st, a.dir); err != nil {
		return out, err
	}
	return out, nil
}

// sameKeys reports whether the set held (raw) names the keys of keys, each
// under the same version ID and in the same state: the same set, however
// it was encoded for the answer that brought it.
func sameKeys(keys []signer.SetKey, raw []byte) bool {
	held, err := signer.ParseVerifierSet(raw)
	if err != nil || len(held.Keys) != len(keys) {
		return false
	}
	for i, k := range keys {
		h := held.Keys[i]
		if h.VersionID != k.VersionID || h.PublicKey != k.PublicKey || h.State != k.State {
			return false
		}
	}
	return true
}

// heldRootPin is the fingerprint of the first root the agent trusts (its
// ca.crt), as --ca-fingerprint takes it; a placeholder naming where it
// comes from when the file cannot be read.
func heldRootPin(dir Dir) string {
	const unknown = "sha256:… (the root muster ca root status names)"
	raw, err := readSmall(dir.CAFile())
	if err != nil {
		return unknown
	}
	roots, err := ca.ParseCertsPEM(raw)
	if err != nil {
		return unknown
	}
	return ca.Fingerprint(roots[0])
}
