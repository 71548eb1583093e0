package agent

import (
	"context"
	"fmt"

	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/spiffeid"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// Renew asks the authority, over mTLS with the current certificate, to
// certify a new key as the next generation of this instance. The new key
// is the pending key of an earlier attempt if there is one (its reply may
// have been lost, and the authority answers the same key with the
// certificate it already issued), else a new one, persisted before the
// request. An expired certificate is refused without asking
// (*ExpiredError). A bound-keypair agent renews as agent run does, by
// repeating the challenge (Rebind): the authority refuses it a plain
// renewal. Errors are *OpError.
func (a *Agent) Renew(ctx context.Context) (*State, error) {
	if st, err := a.dir.ReadState(); err == nil && st.JoinMethod == JoinMethodBoundKeypair {
		return a.Rebind(ctx)
	}
	st, err := a.renew(ctx)
	a.identityWritten()
	a.metrics.renewal(err)
	if err != nil {
		return nil, &OpError{Op: "renewal", Err: err}
	}
	a.log.Info("renewed", "node", st.NodeID, "instance", st.InstanceID, "generation", st.Generation,
		"serial", st.Serial, "not_after", st.NotAfter)
	a.metrics.observe(st)
	return st, nil
}

func (a *Agent) renew(ctx context.Context) (*State, error) {
	// Taking the lock creates the directory; a renewal of a directory
	// that holds no identity (a mistyped --data) must fail leaving none.
	if !a.dir.HasIdentity() {
		return nil, fmt.Errorf("%w: %s", ErrNoIdentity, a.dir)
	}
	unlock, err := a.dir.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	st, id, err := a.load(true)
	if err != nil {
		return nil, err
	}
	now := a.now()
	if !now.Before(id.Leaf().NotAfter) {
		return nil, &ExpiredError{NotAfter: id.Leaf().NotAfter}
	}
	authorityID, err := spiffeid.New(st.TrustDomain, spiffeid.RoleAuthority, st.AuthorityID)
	if err != nil {
		return nil, fmt.Errorf("state.json: %w", err)
	}
	agentID, err := spiffeid.New(st.TrustDomain, spiffeid.RoleAgent, st.NodeID)
	if err != nil {
		return nil, fmt.Errorf("state.json: %w", err)
	}
	key, err := a.dir.pendingKey(true)
	if err != nil {
		return nil, err
	}
	csr, err := csrFor(key)
	if err != nil {
		return nil, err
	}
	conn, err := dial(a.address(st), identity.ClientTLS(id, id.RootPool(), identity.MatchID(authorityID)))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	resp, err := musterv1.NewCertificateServiceClient(conn).RequestCertificate(cctx, &musterv1.RequestCertificateRequest{Csr: csr})
	if err != nil {
		return nil, err
	}
	// A reply's ca_certificate_pem is never a reason to trust another
	// root; its trust bundle is taken by trustbundle.Take's rule (a new
	// root only through a cross-certificate from a root trusted now), and
	// the new certificate must chain to the roots trusted after it.
	roots, err := a.takeBundle(st, id, resp.GetTrustBundle())
	if err != nil {
		return nil, err
	}
	chain, err := verifyIssued(resp.GetCertificateChainPem(), key, roots, agentID, a.now())
	if err != nil {
		return nil, err
	}
	if err := a.dir.writeIdentity(&identity.Identity{Chain: chain, Key: key, Roots: roots}, false); err != nil {
		return nil, err
	}
	renewed := a.now().UTC()
	st.Generation = resp.GetGeneration()
	st.LastRenewal = &renewed
	st.NotAfter = chain[0].NotAfter.UTC()
	st.Serial = serialOf(chain[0])
	if iid := resp.GetInstanceId(); iid != "" {
		st.InstanceID = iid
	}
	a.takeVerifierSet(ctx, st, resp.GetVerifierSet(), false, conn)
	if err := a.dir.writeState(st); err != nil {
		return nil, err
	}
	if err := a.dir.removePendingKey(); err != nil {
		return nil, err
	}
	return st, nil
}

// address is where renewals go: the API address recorded at the join (the
// one the authority advertised, authenticated by the join's answer), else
// MUSTER_AUTHORITY, else agent.yaml's. The latter two name where to join,
// which may be the bootstrap-only listener that serves no renewals, so
// they only stand in for an agent that recorded no address.
func (a *Agent) address(st *State) string {
	if st.Authority != "" {
		return st.Authority
	}
	if a.authority != "" {
		return a.authority
	}
	if cfg, err := a.dir.ReadConfig(); err == nil && cfg.Authority != "" {
		return cfg.Authority
	}
	return ""
}

// load reads the state and identity and checks they describe the same
// node. With fix (the directory locked) it also finishes what a crash left
// half done and drops a token left in agent.yaml after a join.
func (a *Agent) load(fix bool) (*State, *identity.Identity, error) {
	st, err := a.dir.ReadState()
	if err != nil {
		return nil, nil, err
	}
	id, err := a.dir.LoadIdentity()
	if err != nil {
		return nil, nil, err
	}
	got, err := spiffeid.FromCertificate(id.Leaf())
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", a.dir.CertFile(), err)
	}
	if got.Role != spiffeid.RoleAgent || got.Name != st.NodeID || got.TrustDomain != st.TrustDomain {
		return nil, nil, fmt.Errorf("%s is %s, but state.json records node %s of trust domain %s: join again with --force",
			a.dir.CertFile(), got, st.NodeID, st.TrustDomain)
	}
	if !fix {
		return st, id, nil
	}
	if err := a.dir.repair(id); err != nil {
		return nil, nil, err
	}
	if serial := serialOf(id.Leaf()); st.Serial != serial {
		// The certificate was written but not the state: the
		// certificate is the truth (the generation catches up with the
		// next renewal's answer).
		st.Serial, st.NotAfter = serial, id.Leaf().NotAfter.UTC()
		if err := a.dir.writeState(st); err != nil {
			return nil, nil, err
		}
	}
	if cfg, err := a.dir.ReadConfig(); err == nil && (cfg.Token != "" || cfg.PSK != "" || cfg.RegistrationSecret != "") {
		cfg.Token, cfg.PSK, cfg.RegistrationSecret = "", "", ""
		if err := a.dir.WriteConfig(cfg); err != nil {
			return nil, nil, err
		}
		a.log.Info("removed the join secret from agent.yaml: the agent has joined")
	}
	return st, id, nil
}
