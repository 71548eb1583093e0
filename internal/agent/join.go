package agent

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"

	"google.golang.org/grpc/codes"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/errinfo"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/jointoken"
	"github.com/muster-dev/muster/internal/psk"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/trustbundle"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// Join methods, as state.json and agent.yaml name them.
const (
	JoinMethodToken        = "token"
	JoinMethodPSK          = "psk"
	JoinMethodBoundKeypair = "bound-keypair"
)

// JoinRequest is everything a join needs: a join token, or the bootstrap
// PSK (which needs CAFingerprint).
type JoinRequest struct {
	Token jointoken.Token
	PSK   psk.PSK
	// AuthorityID, if set, must be the authority ID a PSK join finds in
	// the authority's certificate; with Discovery it is required.
	AuthorityID string
	Node        string
	// Authority is HOST:PORT; unused with Discovery, which names it.
	Authority string
	// Discovery, if set, is HOST:PORT of a discovery service: the agent
	// looks AuthorityID up there and asks it for a referral ticket.
	// DiscoveryFingerprint pins discovery's CA ("" : system roots).
	Discovery            string
	DiscoveryFingerprint string
	// CAFingerprint, if set, must match a root of the trust bundle.
	CAFingerprint string
	// Force joins over an existing identity, which stays in place until
	// the new join succeeds.
	Force bool
	// BoundKeypair is the name of a bound-keypair token (which needs
	// CAFingerprint); RegistrationSecret, if set, binds the agent's key
	// to it on this first join.
	BoundKeypair       string
	RegistrationSecret string
}

// method is the join method of r.
func (r JoinRequest) method() string {
	if r.BoundKeypair != "" {
		return JoinMethodBoundKeypair
	}
	if r.Token.ID == "" && (!r.PSK.IsZero() || r.Discovery != "") {
		return JoinMethodPSK
	}
	return JoinMethodToken
}

func (r JoinRequest) check() error {
	if r.BoundKeypair != "" {
		return r.checkBound()
	}
	if r.Discovery != "" {
		return r.checkDiscovery()
	}
	switch {
	case r.Token.ID != "" && !r.PSK.IsZero():
		return errors.New("give a join token or a bootstrap PSK, not both")
	case r.Token.ID == "" && r.PSK.IsZero():
		return errors.New("no join token or bootstrap PSK")
	case !r.PSK.IsZero() && r.CAFingerprint == "":
		return errors.New("a bootstrap PSK join needs the CA fingerprint (--ca-fingerprint sha256:…, MUSTER_CA_FINGERPRINT, or a muster+psk:// URI): the PSK is sent only to an authority whose root has that key")
	}
	if err := spiffeid.NameError("node", "node", r.Node); err != nil {
		return err
	}
	if _, _, err := net.SplitHostPort(r.Authority); err != nil || r.Authority == "" {
		return fmt.Errorf("authority address %q: want HOST:PORT", r.Authority)
	}
	if r.CAFingerprint != "" {
		if _, err := ca.ParseFingerprint(r.CAFingerprint); err != nil {
			return err
		}
	}
	return nil
}

// checkDiscovery checks a join through discovery: the PSK flow (a PSK, or
// none while the authority allows it), pinned to the authority's root,
// since discovery's answer is never trusted with a secret.
func (r JoinRequest) checkDiscovery() error {
	switch {
	case r.Token.ID != "":
		return errors.New("a join token goes to the authority's address (--authority), not through discovery")
	case r.AuthorityID == "":
		return errors.New("a join through discovery needs the authority ID (--authority-id, MUSTER_AUTHORITY_ID, authority_id= in the joining URI)")
	case r.CAFingerprint == "":
		return errors.New("a join through discovery needs the authority's CA fingerprint (--ca-fingerprint sha256:…, MUSTER_CA_FINGERPRINT, fingerprint= in the joining URI): discovery's word alone is not trusted")
	}
	if err := spiffeid.NameError("node", "node", r.Node); err != nil {
		return err
	}
	if _, _, err := net.SplitHostPort(r.Discovery); err != nil {
		return fmt.Errorf("discovery address %q: want HOST:PORT", r.Discovery)
	}
	for _, fp := range []string{r.CAFingerprint, r.DiscoveryFingerprint} {
		if fp != "" {
			if _, err := ca.ParseFingerprint(fp); err != nil {
				return err
			}
		}
	}
	return nil
}

// Join admits the machine with a join token: it pins the authority's root
// from the trust bundle signed with the token, then, over a connection
// that verifies the authority by that root and its SPIFFE ID, exchanges
// the token and a CSR for a certificate. It writes the state it is to
// record and what agent.yaml is to say (state.next.json), the certificate
// files, then agent.yaml (where and who, the pins), then state.json, then removes
// the pending key and the token from agent.yaml. Errors are
// *OpError; a bundle that does not verify wraps ErrTrustBundle (classed
// NOT_FOUND), a fingerprint mismatch ErrFingerprint, an existing identity
// ErrIdentityExists.
func (a *Agent) Join(ctx context.Context, r JoinRequest) (*State, error) {
	st, err := a.join(ctx, r)
	a.identityWritten()
	if err != nil {
		return nil, &OpError{Op: "join", Err: err}
	}
	a.log.Info("joined", "node", st.NodeID, "instance", st.InstanceID, "authority_id", st.AuthorityID,
		"authority", st.Authority, "not_after", st.NotAfter)
	a.metrics.observe(st)
	return st, nil
}

func (a *Agent) join(ctx context.Context, r JoinRequest) (_ *State, err error) {
	if err := r.check(); err != nil {
		return nil, err
	}
	unlock, err := a.dir.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	hadIdentity := a.dir.HasIdentity()
	if hadIdentity && !r.Force {
		return nil, ErrIdentityExists
	}
	// The join rewrites agent.yaml with its address, node and pins,
	// keeping every other setting (workload_api among them): one it
	// cannot read would be replaced by an empty one, those settings lost.
	cfg, err := a.dir.ReadConfig()
	if err != nil {
		return nil, fmt.Errorf("%w: correct it, or move it aside (the join writes a new one, without its other settings), and join again; nothing was changed", err)
	}
	defer func() {
		// A failed join leaves no certificate files: neither its own
		// nor those of an earlier join interrupted before it wrote
		// state.json. An identity it was to replace stays.
		if err != nil && !hadIdentity {
			a.dir.removeCertFiles()
			a.dir.removeNextState()
		}
	}()
	// The key is on disk before anything is sent, so a lost reply can be
	// retried with it (and a pending key from an earlier attempt is
	// reused for the same reason).
	key, err := a.dir.pendingKey(true)
	if err != nil {
		return nil, err
	}
	var j *joinResult
	switch r.method() {
	case JoinMethodBoundKeypair:
		j, err = a.joinBound(ctx, r, key)
	case JoinMethodPSK:
		j, err = a.joinPSK(ctx, r, key)
	default:
		j, err = a.joinToken(ctx, r, key)
	}
	if err != nil {
		return nil, err
	}
	chain := j.chain

	now := a.now()
	id := &identity.Identity{Chain: chain, Key: key, Roots: j.roots}
	st := &State{
		NodeID: r.Node, InstanceID: j.instanceID, AuthorityID: j.authorityID,
		TrustDomain: j.trustDomain, Authority: j.renewal, Generation: j.generation,
		JoinMethod: r.method(), JoinedAt: now.UTC(), NotAfter: chain[0].NotAfter.UTC(),
		Serial: serialOf(chain[0]), JoinState: j.joinState, RecoveriesRemaining: j.remaining,
		BoundKeypair: r.BoundKeypair,
	}
	a.takeVerifierSet(ctx, st, j.verifierSet, true, nil)
	joinCfg := &joinConfig{Authority: j.joined, Node: r.Node, JoinMethod: r.method(), BoundKeypair: r.BoundKeypair,
		CAFingerprint: pinOf(j.roots, r.CAFingerprint),
		Discovery:     r.Discovery, DiscoveryFingerprint: r.DiscoveryFingerprint, AuthorityID: r.AuthorityID}
	// The state, and what agent.yaml is to say, go down before the
	// certificate: a join with --force that crashes between the
	// certificate and state.json would leave the old state.json (the old
	// instance, generation, join state) beside the new certificate, which
	// load cannot rebuild from the certificate; and between the
	// certificate and agent.yaml, the old authority's address and pins
	// beside it (load writes both).
	// The trust bundle goes down with them: a crash between the
	// certificate and the bundle would leave the old authority's bundle
	// beside the new certificate (load takes it).
	if err := a.dir.writeNextState(nextState{State: st, Config: joinCfg, Bundle: newJoinBundle(j.bundle)}); err != nil {
		return nil, err
	}
	joinStep("next-state")
	if err := a.dir.writeIdentity(id, true); err != nil {
		return nil, err
	}
	joinStep("identity")
	if _, err := a.takeBundle(st, id, j.bundle); err != nil {
		return nil, err
	}
	// agent.yaml is written before state.json, which makes the join
	// succeed: a crash between the two leaves the address, the node and
	// the pins where restarts and later joins read them (the join's
	// secret stays until state.json exists, so a crash before it can
	// still retry; load drops it after).
	secrets := [3]string{cfg.Token, cfg.PSK, cfg.RegistrationSecret}
	joinCfg.apply(&cfg)
	if err := a.dir.WriteConfig(cfg); err != nil {
		// The identity is in place: say so rather than fail the join.
		a.log.Warn("joining, but agent.yaml could not be updated with the authority's address and pins", "err", err)
	}
	joinStep("config")
	if err := a.dir.writeState(st); err != nil {
		return nil, err
	}
	joinStep("state")
	if err := a.dir.removeNextState(); err != nil {
		a.log.Warn("joined, but state.next.json could not be removed", "err", err)
	}
	// From here the join has succeeded: state.json is written. A crash
	// before the next two steps is finished by load's repair (the
	// certified key left pending, the secret left in agent.yaml).
	if err := a.dir.removePendingKey(); err != nil {
		a.log.Warn("joined, but the certified key could not be removed from keys/", "err", err)
	}
	joinStep("pending")
	// The configuration keeps where and who, never the secret.
	if secrets != [3]string{} {
		cfg.Token, cfg.PSK, cfg.RegistrationSecret = "", "", ""
		if err := a.dir.WriteConfig(cfg); err != nil {
			a.log.Warn("joined, but agent.yaml could not be updated; remove any token or PSK from it by hand", "err", err)
		}
	}
	return st, nil
}

// joinStep marks where a join stands between its writes; tests set it to
// stop the join there, as a crash would.
var joinStep = func(string) {}

// joinResult is what a join method's exchange established.
type joinResult struct {
	chain                    []*x509.Certificate // without the root
	roots                    []*x509.Certificate // the pinned roots
	authorityID, trustDomain string
	instanceID               string
	generation               int64
	// joinState and remaining are a bound-keypair join's.
	joinState string
	remaining *int64
	// renewal is the address renewals go to; joined the one the join
	// went to.
	renewal, joined string
	// verifierSet is the signed verifier set the answer carried.
	verifierSet []byte
	// bundle is the trust bundle the answer carried (nil from an
	// authority that sends none).
	bundle *musterv1.TrustBundle
}

func (a *Agent) joinToken(ctx context.Context, r JoinRequest, key crypto.Signer) (*joinResult, error) {
	bundle, err := a.trust(ctx, r)
	if err != nil {
		return nil, err
	}
	chain, resp, err := a.exchange(ctx, r, bundle, key)
	if err != nil {
		return nil, err
	}
	return &joinResult{chain: chain, roots: bundle.RootCerts, authorityID: bundle.AuthorityID, trustDomain: bundle.TrustDomain,
		instanceID: resp.GetInstanceId(), generation: resp.GetGeneration(),
		renewal: renewalAddress(bundle.Endpoints, r.Authority), joined: r.Authority, verifierSet: resp.GetVerifierSet(),
		bundle: resp.GetTrustBundle()}, nil
}

// pinOf is the fingerprint to record: the one given, else the first root's.
func pinOf(roots []*x509.Certificate, given string) string {
	if given != "" {
		fp, _ := ca.ParseFingerprint(given)
		return fp
	}
	return ca.Fingerprint(roots[0])
}

// trust fetches the trust bundle over a connection that verifies nothing
// and presents nothing, sending only the token ID, and accepts it only if
// it is signed with the token's secret (and, given a fingerprint, holds
// that root).
func (a *Agent) trust(ctx context.Context, r JoinRequest) (*trustbundle.Verified, error) {
	// The server is unauthenticated here on purpose: what it answers is
	// believed only if it is signed with a secret it cannot know unless
	// it is the authority, and nothing secret goes out on this
	// connection.
	conn, err := dial(r.Authority, &tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true,
		NextProtos:         []string{"h2"},
	})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	resp, err := musterv1.NewBootstrapServiceClient(conn).GetTrustBundle(cctx, &musterv1.GetTrustBundleRequest{TokenId: r.Token.ID})
	if err != nil {
		return nil, fmt.Errorf("trust bundle: %w", err)
	}
	v, err := trustbundle.Verify(resp.GetJws(), r.Token.ID, trustbundle.Key(r.Token.ID, r.Token.Secret()))
	if err != nil {
		return nil, &refusal{codes.NotFound, fmt.Errorf("%w (the trust bundle from %s is not signed with this token, or %s is not the authority; the secret was not sent)",
			ErrTrustBundle, r.Authority, r.Authority)}
	}
	if r.AuthorityID != "" && v.AuthorityID != r.AuthorityID {
		return nil, fmt.Errorf("the trust bundle from %s names authority %s, want %s; the secret was not sent", r.Authority, v.AuthorityID, r.AuthorityID)
	}
	if r.CAFingerprint != "" {
		pinned := false
		for _, c := range v.RootCerts {
			if ca.MatchesFingerprint(c, r.CAFingerprint) {
				pinned = true
			}
		}
		if !pinned {
			return nil, fmt.Errorf("%w %s (the authority at %s has root %s; the secret was not sent)",
				ErrFingerprint, r.CAFingerprint, r.Authority, ca.Fingerprint(v.RootCerts[0]))
		}
		// Only the pinned root is trusted from here on.
		v.RootCerts = pinnedRoots(v.RootCerts, r.CAFingerprint)
	}
	return v, nil
}

func pinnedRoots(roots []*x509.Certificate, fp string) []*x509.Certificate {
	var out []*x509.Certificate
	for _, c := range roots {
		if ca.MatchesFingerprint(c, fp) {
			out = append(out, c)
		}
	}
	return out
}

// exchange sends the token, over a connection verified by the pinned roots
// and the authority's SPIFFE ID, and checks the certificate it gets.
func (a *Agent) exchange(ctx context.Context, r JoinRequest, b *trustbundle.Verified, key crypto.Signer) ([]*x509.Certificate, *musterv1.ExchangeJoinTokenResponse, error) {
	authorityID, err := spiffeid.New(b.TrustDomain, spiffeid.RoleAuthority, b.AuthorityID)
	if err != nil {
		return nil, nil, fmt.Errorf("trust bundle: %w", err)
	}
	agentID, err := spiffeid.New(b.TrustDomain, spiffeid.RoleAgent, r.Node)
	if err != nil {
		return nil, nil, err
	}
	pool := x509.NewCertPool()
	for _, c := range b.RootCerts {
		pool.AddCert(c)
	}
	tc := identity.ClientTLS(nil, pool, identity.MatchID(authorityID))
	// During a root rotation the server presents its other root with a
	// cross-certificate under the pinned one; the certificate issued may
	// chain to either, and the agent keeps both (identity.CrossCertified).
	var presented []*x509.Certificate
	verify := tc.VerifyConnection
	tc.VerifyConnection = func(cs tls.ConnectionState) error {
		if err := verify(cs); err != nil {
			return err
		}
		presented = cs.PeerCertificates
		return nil
	}
	conn, err := dial(r.Authority, tc)
	if err != nil {
		return nil, nil, err
	}
	defer conn.Close()
	csr, err := csrFor(key)
	if err != nil {
		return nil, nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	resp, err := musterv1.NewBootstrapServiceClient(conn).ExchangeJoinToken(cctx, &musterv1.ExchangeJoinTokenRequest{
		JoinToken: r.Token.Reveal(), NodeId: r.Node, Csr: csr,
	})
	if err != nil {
		return nil, nil, tokenRefusalHint(err, r.Token.ID, r.Node)
	}
	if aid := resp.GetAuthorityId(); aid != "" && aid != b.AuthorityID {
		return nil, nil, fmt.Errorf("the authority answered as %s, but its trust bundle names %s", aid, b.AuthorityID)
	}
	if td := resp.GetTrustDomain(); td != "" && td != b.TrustDomain {
		return nil, nil, fmt.Errorf("the authority answered for trust domain %s, but its trust bundle names %s", td, b.TrustDomain)
	}
	b.RootCerts = append(b.RootCerts, identity.CrossCertified(presented, pool, a.now())...)
	chain, err := verifyIssued(resp.GetCertificateChainPem(), key, b.RootCerts, agentID, a.now())
	if err != nil {
		return nil, nil, err
	}
	return chain, resp, nil
}

// renewalAddress is where the agent renews: the API address the authority
// advertises in its signed trust bundle. The join may have gone through
// the bootstrap-only listener, which serves no renewals.
func renewalAddress(endpoints []string, joined string) string {
	for _, e := range endpoints {
		host, _, err := net.SplitHostPort(e)
		if err != nil {
			continue
		}
		// An authority listening on every interface without --advertise
		// advertises "[::]:7443", which names no machine to dial.
		if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
			continue
		}
		return e
	}
	return joined
}

// tokenRefusalHint adds to a join token's refusal the way out, what the
// operator runs on the authority (DESIGN.md's table of join refusals, the
// "what to do" of the operator guide's): a refused join consumed nothing,
// and only a new token, another node ID or the node's deletion helps.
// The code, the message's start and the reason word stay.
func tokenRefusalHint(err error, tokenID, node string) error {
	var hint string
	switch errinfo.Reason(err) {
	case "token_expired", "token_used_up", "token_spent":
		hint = fmt.Sprintf("nothing was consumed; join with a new token: on the authority, muster token create --node %s (muster token get %s shows this one's uses and expiry)", node, tokenID)
	case "token_bound_elsewhere":
		hint = fmt.Sprintf("muster token get %s names the node it admits: join with that node ID, or with a token for this one: muster token create --node %s", tokenID, node)
	case "node_taken":
		hint = nodeTakenHint(node)
	case "locked":
		hint = joinLockedHint(node)
	default:
		return err
	}
	return withHint(err, hint)
}

// joinLockedHint is the way out of a join refused by a lock (on the node,
// or on the token that would admit it): the refusal says only "locked",
// and the machine's operator was told nothing to act on. The lock's ID
// and why are in the authority's audit record of the refused join.
func joinLockedHint(node string) string {
	return fmt.Sprintf("a lock on node %s or on the token refuses the join, and nothing was consumed: on the authority, muster lock list names it and why "+
		"(muster audit list --action agent.join, the refusal's record, names its ID); if this machine should join, muster lock delete LOCK-ID lifts it", node)
}

// nodeTakenHint is the way out of a join whose node ID exists, by token
// or PSK: the same machine re-provisioned takes its node with a token
// bound to it; a machine that is gone gives its node ID back.
func nodeTakenHint(node string) string {
	return fmt.Sprintf("if this machine is node %s, join with a token bound to it (on the authority, muster token create --node %s; over an identity, agent join --force); if that machine is gone: muster agents delete %s; else choose another node ID", node, node, node)
}
