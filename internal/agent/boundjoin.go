package agent

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/spiffeid"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// JoinBoundKeypair runs the bound-keypair stream (DESIGN.md, join method
// 3): it sends init, signs the authority's challenge with key, and returns
// the result. It signs only a challenge addressed to authorityID, the
// authority the caller pinned, so an answer cannot be replayed to another.
func JoinBoundKeypair(ctx context.Context, c musterv1.JoinServiceClient, init *musterv1.BoundKeypairInit, key ed25519.PrivateKey, authorityID string) (*musterv1.BoundKeypairResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.RegisterUsingBoundKeypair(ctx)
	if err != nil {
		return nil, err
	}
	if err := stream.Send(&musterv1.RegisterUsingBoundKeypairRequest{Payload: &musterv1.RegisterUsingBoundKeypairRequest_Init{Init: init}}); err != nil {
		return nil, err
	}
	msg, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	ch, err := boundkeypair.ParseChallenge(msg.GetChallenge())
	if err != nil {
		return nil, err
	}
	if ch.Audience != authorityID {
		return nil, fmt.Errorf("agent: the challenge is for authority %.64q, not %s", ch.Audience, authorityID)
	}
	answer, err := boundkeypair.Answer(key, ch, time.Now())
	if err != nil {
		return nil, err
	}
	if err := stream.Send(&musterv1.RegisterUsingBoundKeypairRequest{Payload: &musterv1.RegisterUsingBoundKeypairRequest_ChallengeResponse{
		ChallengeResponse: answer}}); err != nil {
		return nil, err
	}
	msg, err = stream.Recv()
	if err != nil {
		return nil, err
	}
	if msg.GetResult() == nil {
		return nil, errors.New("agent: the authority sent no result after the challenge")
	}
	return msg.GetResult(), nil
}

// checkBound checks a bound-keypair join: it goes to the authority's
// address, pinned to its root, since the challenge is answered only for
// an authority proved by that root.
func (r JoinRequest) checkBound() error {
	switch {
	case r.Token.ID != "" || !r.PSK.IsZero():
		return errors.New("give a bound-keypair token, a join token or a bootstrap PSK, not several")
	case r.Discovery != "":
		return errors.New("a bound-keypair join goes to the authority's address (--authority), not through discovery")
	case r.CAFingerprint == "":
		return errors.New("a bound-keypair join needs the CA fingerprint (--ca-fingerprint sha256:…, MUSTER_CA_FINGERPRINT, or a muster+bound-keypair:// URI): the key signs a challenge only for an authority whose root has that key")
	}
	if err := spiffeid.ValidNodeID(r.BoundKeypair); err != nil {
		return fmt.Errorf("bound-keypair token name: %w", err)
	}
	if err := spiffeid.ValidNodeID(r.Node); err != nil {
		return fmt.Errorf("node ID: %w", err)
	}
	if _, _, err := net.SplitHostPort(r.Authority); err != nil || r.Authority == "" {
		return fmt.Errorf("authority address %q: want HOST:PORT", r.Authority)
	}
	_, err := ca.ParseFingerprint(r.CAFingerprint)
	return err
}

// boundKey is the key a bound-keypair join proves: keys/bound.key, made
// here on a first join that registers it with the secret.
func (a *Agent) boundKey(register bool) (ed25519.PrivateKey, error) {
	priv, err := LoadBoundKey(a.dir)
	if errors.Is(err, fs.ErrNotExist) && register {
		if _, err := CreateBoundKey(a.dir); err != nil {
			return nil, err
		}
		a.log.Info("made the bound key to register", "path", a.dir.BoundKeyFile())
		return LoadBoundKey(a.dir)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return nil, &refusal{codes.FailedPrecondition, fmt.Errorf("no bound key in %s: run muster keypair create --data %s and give its public key to muster bot add --public-key, or join with the registration secret",
			a.dir.BoundKeyFile(), string(a.dir))}
	}
	return priv, err
}

// joinBound is the first bound-keypair join: the authority is verified by
// the pinned root before anything is sent, then the key answers its
// challenge (and, with the registration secret, is bound to the token).
func (a *Agent) joinBound(ctx context.Context, r JoinRequest, key crypto.Signer) (*joinResult, error) {
	priv, err := a.boundKey(r.RegistrationSecret != "")
	if err != nil {
		return nil, err
	}
	peer, err := a.probeAuthority(ctx, r)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(peer.root)
	roots := []*x509.Certificate{peer.root}
	init := &musterv1.BoundKeypairInit{Token: r.BoundKeypair, NodeId: r.Node}
	if r.RegistrationSecret != "" {
		pub, err := boundkeypair.NewPublicKey(priv.Public().(ed25519.PublicKey))
		if err != nil {
			return nil, err
		}
		init.PublicKey, init.RegistrationSecret = pub.String(), r.RegistrationSecret
	}
	if r.Force {
		// A join over an identity presents its join state: without it
		// a standard-mode token refuses the recovery.
		if st, err := a.dir.ReadState(); err == nil {
			init.PreviousJoinState = st.JoinState
		}
	}
	res, chain, err := a.boundExchange(ctx, r.Authority, identity.ClientTLS(nil, pool, identity.MatchID(peer.id)), init, priv, key,
		peer.id, roots, r.Node)
	if err != nil {
		return nil, err
	}
	remaining := res.GetRecoveriesRemaining()
	return &joinResult{chain: chain, roots: roots, authorityID: peer.id.Name, trustDomain: peer.id.TrustDomain,
		instanceID: res.GetInstanceId(), generation: res.GetGeneration(), joinState: res.GetJoinState(), remaining: &remaining,
		renewal: renewalAddress(res.GetEndpoints(), r.Authority), joined: r.Authority}, nil
}

// boundExchange runs the stream over a connection made with tc (which
// verifies the authority authorityID) for a certificate of key, and checks
// the certificate it gets.
func (a *Agent) boundExchange(ctx context.Context, addr string, tc *tls.Config, init *musterv1.BoundKeypairInit, priv ed25519.PrivateKey,
	key crypto.Signer, authorityID spiffeid.ID, roots []*x509.Certificate, node string) (*musterv1.BoundKeypairResult, []*x509.Certificate, error) {
	agentID, err := spiffeid.New(authorityID.TrustDomain, spiffeid.RoleAgent, node)
	if err != nil {
		return nil, nil, err
	}
	if init.Csr, err = csrFor(key); err != nil {
		return nil, nil, err
	}
	conn, err := dial(addr, tc)
	if err != nil {
		return nil, nil, err
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	res, err := JoinBoundKeypair(cctx, musterv1.NewJoinServiceClient(conn), init, priv, authorityID.Name)
	if err != nil {
		return nil, nil, err
	}
	chain, err := verifyIssued(res.GetCertificateChainPem(), key, roots, agentID, a.now())
	if err != nil {
		return nil, nil, err
	}
	return res, chain, nil
}

// Rebind repeats the bound-keypair challenge with the key and the last
// join state: with a valid certificate it is a refresh of the current
// instance (the authority consumes nothing); without one it is a
// recovery, answered with a new instance. Errors are *OpError.
func (a *Agent) Rebind(ctx context.Context) (*State, error) {
	st, op, err := a.rebind(ctx)
	a.metrics.renewal(err)
	if err != nil {
		return nil, &OpError{Op: op, Err: err}
	}
	a.log.Info(op+" done", "node", st.NodeID, "instance", st.InstanceID, "generation", st.Generation,
		"serial", st.Serial, "not_after", st.NotAfter, "recoveries_remaining", remainingOf(st))
	a.metrics.observe(st)
	return st, nil
}

func remainingOf(st *State) int64 {
	if st.RecoveriesRemaining == nil {
		return -1
	}
	return *st.RecoveriesRemaining
}

func (a *Agent) rebind(ctx context.Context) (*State, string, error) {
	op := "refresh"
	unlock, err := a.dir.lock(ctx)
	if err != nil {
		return nil, op, err
	}
	defer unlock()
	st, id, err := a.load(true)
	if err != nil {
		return nil, op, err
	}
	if st.JoinMethod != JoinMethodBoundKeypair || st.BoundKeypair == "" {
		return nil, op, fmt.Errorf("state.json records join method %q, not a bound-keypair token", st.JoinMethod)
	}
	client := id
	if !a.now().Before(id.Leaf().NotAfter) {
		op, client = "recovery", nil
	}
	authorityID, err := spiffeid.New(st.TrustDomain, spiffeid.RoleAuthority, st.AuthorityID)
	if err != nil {
		return nil, op, fmt.Errorf("state.json: %w", err)
	}
	priv, err := a.boundKey(false)
	if err != nil {
		return nil, op, err
	}
	key, err := a.dir.pendingKey(true)
	if err != nil {
		return nil, op, err
	}
	init := &musterv1.BoundKeypairInit{Token: st.BoundKeypair, NodeId: st.NodeID, PreviousJoinState: st.JoinState}
	res, chain, err := a.boundExchange(ctx, a.address(st), identity.ClientTLS(client, id.RootPool(), identity.MatchID(authorityID)),
		init, priv, key, authorityID, id.Roots, st.NodeID)
	if err != nil {
		return nil, op, err
	}
	if err := a.dir.writeIdentity(&identity.Identity{Chain: chain, Key: key, Roots: id.Roots}, false); err != nil {
		return nil, op, err
	}
	now := a.now().UTC()
	remaining := res.GetRecoveriesRemaining()
	st.Generation, st.LastRenewal, st.NotAfter, st.Serial = res.GetGeneration(), &now, chain[0].NotAfter.UTC(), serialOf(chain[0])
	st.InstanceID, st.JoinState, st.RecoveriesRemaining = res.GetInstanceId(), res.GetJoinState(), &remaining
	if err := a.dir.writeState(st); err != nil {
		return nil, op, err
	}
	if err := a.dir.removePendingKey(); err != nil {
		return nil, op, err
	}
	return st, op, nil
}

// retryableBound: besides transient failures, a spent recovery budget is
// worth retrying, since an operator raising the limit brings the agent
// back with no change on its side.
func retryableBound(err error) bool {
	if Transient(err) {
		return true
	}
	s, ok := status.FromError(err)
	return ok && s.Code() == codes.FailedPrecondition && strings.Contains(s.Message(), boundkeypair.ErrRecoveryExhausted.Error())
}
