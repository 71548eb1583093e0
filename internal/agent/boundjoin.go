package agent

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/atomicfile"
	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/errinfo"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/shellword"
	"github.com/muster-dev/muster/internal/spiffeid"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// JoinBoundKeypair runs the bound-keypair stream (DESIGN.md, join method
// 3) with key alone: it cannot rotate (see ExchangeBoundKeypair).
func JoinBoundKeypair(ctx context.Context, c musterv1.JoinServiceClient, init *musterv1.BoundKeypairInit, key ed25519.PrivateKey, authorityID string) (*musterv1.BoundKeypairResult, error) {
	return ExchangeBoundKeypair(ctx, c, init, &BoundKeys{Current: key}, authorityID)
}

// BoundKeys are the keys a bound-keypair exchange signs with.
type BoundKeys struct {
	// Current is the bound key: it signs the first challenge.
	Current ed25519.PrivateKey
	// Next, if set, is a pending key offered in init.new_public_key: it
	// signs the second challenge.
	Next ed25519.PrivateKey
	// NewKey, if set, makes the key the authority asks for when the
	// token's rotate_after has passed, and stores it as pending before it
	// returns, so an agent that dies before the result still has it. The
	// exchange records the key it made in Next.
	NewKey func() (ed25519.PrivateKey, error)
}

// pending is the key a rotation in this exchange offered, or nil.
func (k *BoundKeys) pending() ed25519.PrivateKey { return k.Next }

// boundKeys are the agent's keys for an exchange: the bound key, the
// pending key of an interrupted rotation (offered again), and the means
// to make one when the authority asks.
func (a *Agent) boundKeys(current ed25519.PrivateKey) (*BoundKeys, error) {
	next, err := a.pendingBoundKey()
	if err != nil {
		return nil, err
	}
	if next != nil {
		a.log.Info("offering the pending bound key of an interrupted rotation", "path", a.dir.NextBoundKeyFile())
	}
	return &BoundKeys{Current: current, Next: next, NewKey: a.newPendingBoundKey}, nil
}

// ExchangeBoundKeypair runs the bound-keypair stream: it sends init, signs
// the authority's challenge with keys.Current, answers a request for a new
// key with keys.NewKey and signs the next challenge with that key (or with
// keys.Next, offered in init), and returns the result. It signs only a
// challenge addressed to authorityID, the authority the caller pinned, so
// an answer cannot be replayed to another.
func ExchangeBoundKeypair(ctx context.Context, c musterv1.JoinServiceClient, init *musterv1.BoundKeypairInit, keys *BoundKeys, authorityID string) (*musterv1.BoundKeypairResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.RegisterUsingBoundKeypair(ctx)
	if err != nil {
		return nil, err
	}
	if init.PublicKey == "" {
		// Offered in every join: after a restore, a resync window
		// rebinds the token to it if the agent's join state names it.
		pub, err := boundkeypair.NewPublicKey(keys.Current.Public().(ed25519.PublicKey))
		if err != nil {
			return nil, err
		}
		init.PublicKey = pub.String()
	}
	if keys.Next != nil {
		pub, err := boundkeypair.NewPublicKey(keys.Next.Public().(ed25519.PublicKey))
		if err != nil {
			return nil, err
		}
		init.NewPublicKey = pub.String()
	}
	if err := stream.Send(&musterv1.RegisterUsingBoundKeypairRequest{Payload: &musterv1.RegisterUsingBoundKeypairRequest_Init{Init: init}}); err != nil {
		return nil, err
	}
	// The authority sends at most two challenges: the bound key's, then
	// the new key's; anything more is not the protocol.
	signer, challenges := keys.Current, 0
	for {
		msg, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		switch p := msg.GetPayload().(type) {
		case *musterv1.RegisterUsingBoundKeypairResponse_Result:
			return p.Result, nil
		case *musterv1.RegisterUsingBoundKeypairResponse_NewKeyRequest:
			if keys.NewKey == nil || keys.Next != nil || challenges != 1 {
				return nil, errors.New("agent: the authority asked for a new bound key this agent cannot give now")
			}
			next, err := keys.NewKey()
			if err != nil {
				return nil, err
			}
			pub, err := boundkeypair.NewPublicKey(next.Public().(ed25519.PublicKey))
			if err != nil {
				return nil, err
			}
			keys.Next = next
			if err := stream.Send(&musterv1.RegisterUsingBoundKeypairRequest{Payload: &musterv1.RegisterUsingBoundKeypairRequest_NewPublicKey{
				NewPublicKey: pub.String()}}); err != nil {
				return nil, err
			}
		case *musterv1.RegisterUsingBoundKeypairResponse_Challenge:
			if challenges++; challenges == 2 {
				signer = keys.Next
			}
			if signer == nil || challenges > 2 {
				return nil, errors.New("agent: the authority sent a challenge no key of this agent is for")
			}
			ch, err := boundkeypair.ParseChallenge(p.Challenge)
			if err != nil {
				return nil, err
			}
			if ch.Audience != authorityID {
				return nil, fmt.Errorf("agent: the challenge is for authority %.64q, not %s", ch.Audience, authorityID)
			}
			answer, err := boundkeypair.Answer(signer, ch, time.Now())
			if err != nil {
				return nil, err
			}
			if err := stream.Send(&musterv1.RegisterUsingBoundKeypairRequest{Payload: &musterv1.RegisterUsingBoundKeypairRequest_ChallengeResponse{
				ChallengeResponse: answer}}); err != nil {
				return nil, err
			}
		default:
			return nil, errors.New("agent: the authority sent a message this agent does not know")
		}
	}
}

// checkBound checks a bound-keypair join: it goes to the authority's
// address, or through discovery with the authority ID, pinned to its root
// either way, since the challenge is answered only for an authority proved
// by that root. Through discovery no referral ticket is asked for: the
// bound key is the proof, and discovery is trusted with nothing.
func (r JoinRequest) checkBound() error {
	switch {
	case r.Token.ID != "" || !r.PSK.IsZero():
		return errors.New("give a bound-keypair token, a join token or a bootstrap PSK, not several")
	case r.Discovery != "" && r.AuthorityID == "":
		return errors.New("a bound-keypair join through discovery needs the authority ID (--authority-id, MUSTER_AUTHORITY_ID, authority_id= in the joining URI)")
	case r.CAFingerprint == "":
		return errors.New("a bound-keypair join needs the CA fingerprint (--ca-fingerprint sha256:…, MUSTER_CA_FINGERPRINT, or a muster+bound-keypair:// URI): the key signs a challenge only for an authority whose root has that key")
	}
	if err := spiffeid.NameError("bound-keypair token", "bound-keypair token", r.BoundKeypair); err != nil {
		return err
	}
	if err := spiffeid.NameError("node", "node", r.Node); err != nil {
		return err
	}
	if r.Discovery != "" {
		if _, _, err := net.SplitHostPort(r.Discovery); err != nil {
			return fmt.Errorf("discovery address %q: want HOST:PORT", r.Discovery)
		}
		if r.DiscoveryFingerprint != "" {
			if _, err := ca.ParseFingerprint(r.DiscoveryFingerprint); err != nil {
				return fmt.Errorf("discovery fingerprint: %w", err)
			}
		}
	} else if _, _, err := net.SplitHostPort(r.Authority); err != nil || r.Authority == "" {
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
		return nil, &refusal{codes.FailedPrecondition, fmt.Errorf("no bound key in %s: run muster keypair create --data %s and give its public key to muster bot add NAME --public-key FILE, or join with the registration secret",
			a.dir.BoundKeyFile(), shellword.Quote(string(a.dir)))}
	}
	return priv, err
}

// JoiningBoundKeyFile is the fresh bound key of a join over an identity
// with a registration secret, kept apart until the join succeeds.
func (d Dir) JoiningBoundKeyFile() string { return d.path("keys", "bound.join.key") }

// joiningBoundKey is the key a first join proves, and whether it is a
// fresh one (in JoiningBoundKeyFile) to replace keys/bound.key once the
// join succeeds. A join over an identity (--force) with a registration
// secret registers a fresh key, not the bound key of the identity it
// replaces: that key may be in other hands (the way out of a copied data
// directory is a new token registered from the genuine machine), and the
// new token must not be bound to a key a copy holds. A key made for the
// static binding (keypair create, then bot add --public-key) is not
// registered with a secret, and a first join with a secret into a
// directory holding no identity uses the key it finds, as before.
func (a *Agent) joiningBoundKey(r JoinRequest) (ed25519.PrivateKey, bool, error) {
	if r.RegistrationSecret == "" || !r.Force {
		priv, err := a.boundKey(r.RegistrationSecret != "")
		return priv, false, err
	}
	if _, err := a.dir.ReadState(); err != nil {
		priv, err := a.boundKey(true)
		return priv, false, err
	}
	if _, err := os.Stat(a.dir.BoundKeyFile()); errors.Is(err, fs.ErrNotExist) {
		priv, err := a.boundKey(true)
		return priv, false, err
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, false, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, false, err
	}
	if err := atomicfile.Write(a.dir.JoiningBoundKeyFile(), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return nil, false, fmt.Errorf("agent: %w", err)
	}
	a.log.Info("made a fresh bound key to register: the one of the identity replaced stays until the join succeeds", "path", a.dir.JoiningBoundKeyFile())
	return priv, true, nil
}

// adoptJoiningBoundKey makes the fresh key of a join that succeeded the
// bound key (one rename, so a crash leaves the old key or the new). A
// pending rotation key of the identity replaced is dropped unless this
// join made one (dropPending).
func (a *Agent) adoptJoiningBoundKey(dropPending bool) error {
	if err := os.Rename(a.dir.JoiningBoundKeyFile(), a.dir.BoundKeyFile()); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	if dropPending {
		if err := os.Remove(a.dir.NextBoundKeyFile()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("agent: %w", err)
		}
	}
	if err := atomicfile.SyncDir(filepath.Dir(a.dir.BoundKeyFile())); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	a.log.Info("registered a fresh bound key", "path", a.dir.BoundKeyFile())
	return nil
}

// joinBound is the first bound-keypair join: the authority (looked up
// through discovery when r names one) is verified by the pinned root
// before anything is sent, then the key answers its
// challenge (and, with the registration secret, is bound to the token).
func (a *Agent) joinBound(ctx context.Context, r JoinRequest, key crypto.Signer) (*joinResult, error) {
	priv, fresh, err := a.joiningBoundKey(r)
	if err != nil {
		return nil, err
	}
	if fresh {
		// Until the join succeeds the old identity stays whole; a failed
		// join leaves no fresh key behind.
		defer func() {
			if err := os.Remove(a.dir.JoiningBoundKeyFile()); err != nil && !errors.Is(err, fs.ErrNotExist) {
				a.log.Warn("could not remove the bound key of a failed join", "path", a.dir.JoiningBoundKeyFile(), "err", err)
			}
		}()
	}
	var peer *authorityPeer
	if r.Discovery != "" {
		// The exchange goes to the endpoint that proved itself; no
		// ticket is needed, the bound key being the proof.
		if r.Authority, peer, err = a.locate(ctx, r); err != nil {
			return nil, err
		}
	} else if peer, err = a.probeAuthority(ctx, r); err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	for _, r := range peer.roots {
		pool.AddCert(r)
	}
	roots := peer.roots
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
	keys := &BoundKeys{Current: priv, NewKey: a.newPendingBoundKey}
	if !fresh {
		if keys, err = a.boundKeys(priv); err != nil {
			return nil, err
		}
	}
	res, chain, err := a.boundExchange(ctx, r.Authority, identity.ClientTLS(nil, pool, identity.MatchID(peer.id)), init, keys, key,
		peer.id, func(*musterv1.BoundKeypairResult) []*x509.Certificate { return roots }, r.Node)
	if err != nil {
		if r.RegistrationSecret != "" && errinfo.Reason(err) == reasonChallengeFailed {
			// Registering, the secret is what was refused.
			return nil, withHint(err, fmt.Sprintf("the registration secret is not token %s's: muster token get %s on the authority shows it until it is used", r.BoundKeypair, r.BoundKeypair))
		}
		return nil, boundRefusalHint(err, &State{NodeID: r.Node, BoundKeypair: r.BoundKeypair}, a.dir)
	}
	if fresh {
		if err := a.adoptJoiningBoundKey(keys.pending() == nil); err != nil {
			return nil, err
		}
	}
	if err := a.settleBoundKey(keys.pending(), res.GetBoundKeyFingerprint()); err != nil {
		return nil, err
	}
	remaining := res.GetRecoveriesRemaining()
	return &joinResult{chain: chain, roots: roots, authorityID: peer.id.Name, trustDomain: peer.id.TrustDomain,
		instanceID: res.GetInstanceId(), generation: res.GetGeneration(), joinState: res.GetJoinState(), remaining: &remaining,
		renewal: renewalAddress(res.GetEndpoints(), r.Authority), joined: r.Authority, verifierSet: res.GetVerifierSet(),
		bundle: res.GetTrustBundle()}, nil
}

// boundExchange runs the stream over a connection made with tc (which
// verifies the authority authorityID) for a certificate of key, and checks
// the certificate it gets against the roots rootsFor the result trusts.
func (a *Agent) boundExchange(ctx context.Context, addr string, tc *tls.Config, init *musterv1.BoundKeypairInit, keys *BoundKeys,
	key crypto.Signer, authorityID spiffeid.ID, rootsFor func(*musterv1.BoundKeypairResult) []*x509.Certificate, node string) (*musterv1.BoundKeypairResult, []*x509.Certificate, error) {
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
	res, err := ExchangeBoundKeypair(cctx, musterv1.NewJoinServiceClient(conn), init, keys, authorityID.Name)
	if err != nil {
		return nil, nil, err
	}
	chain, err := verifyIssued(res.GetCertificateChainPem(), key, rootsFor(res), agentID, a.now())
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
	a.identityWritten()
	a.metrics.renewal(err)
	if err != nil {
		return nil, &OpError{Op: op, Err: err}
	}
	a.authorityAnswered()
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
	previous := st.InstanceID
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
	keys, err := a.boundKeys(priv)
	if err != nil {
		return nil, op, err
	}
	// The answer's bundle is decided on first (a new root only through a
	// cross-certificate from a root held now), the certificate verified
	// against the roots trusted after it, and only then is anything
	// written: a refresh in update_servers gets a leaf under the new root,
	// which an agent that missed init learns from this very bundle.
	var plan bundlePlan
	rootsFor := func(res *musterv1.BoundKeypairResult) []*x509.Certificate {
		plan = a.planBundle(st, id, res.GetTrustBundle())
		return plan.roots
	}
	exchange := func(keys *BoundKeys) (*musterv1.BoundKeypairResult, []*x509.Certificate, error) {
		init := &musterv1.BoundKeypairInit{Token: st.BoundKeypair, NodeId: st.NodeID, PreviousJoinState: st.JoinState}
		return a.boundExchange(ctx, a.address(st), identity.ClientTLS(client, id.RootPool(), identity.MatchID(authorityID)),
			init, keys, key, authorityID, rootsFor, st.NodeID)
	}
	res, chain, err := exchange(keys)
	if pending := keys.pending(); err != nil && pending != nil && errinfo.Reason(err) == reasonChallengeFailed {
		// A rotation whose result was lost: the authority may have bound
		// the pending key already, so the bound one no longer proves.
		a.log.Warn("the bound key was refused while a rotation is pending; proving the pending key", "err", a.logged(err))
		keys = &BoundKeys{Current: pending}
		res, chain, err = exchange(keys)
		keys.Next = pending
	}
	if err != nil {
		return nil, op, boundRefusalHint(untrustedAuthorityHint(err, st, a.dir), st, a.dir)
	}
	if err := a.settleBoundKey(keys.pending(), res.GetBoundKeyFingerprint()); err != nil {
		return nil, op, err
	}
	// The bundle before the identity: the roots trusted after the answer
	// hold the current certificate's as well as the new one's, so a crash
	// between the two leaves the current identity beside roots that
	// verify it and the authority (and the pending key to ask again
	// with); the other way round, it left a certificate under a new root
	// beside roots without it. The keystore is the current identity's
	// until the new one replaces it.
	renewed := &identity.Identity{Chain: chain, Key: key, Roots: plan.roots}
	if err := a.writeBundle(st, id, plan); err != nil {
		return nil, op, err
	}
	renewStep("bundle")
	if err := a.dir.writeIdentity(renewed, false); err != nil {
		return nil, op, err
	}
	now := a.now().UTC()
	remaining := res.GetRecoveriesRemaining()
	st.Generation, st.LastRenewal, st.NotAfter, st.Serial = res.GetGeneration(), &now, chain[0].NotAfter.UTC(), serialOf(chain[0])
	st.InstanceID, st.JoinState, st.RecoveriesRemaining = res.GetInstanceId(), res.GetJoinState(), &remaining
	a.takeVerifierSet(ctx, st, res.GetVerifierSet(), false, nil)
	if err := a.dir.writeState(st); err != nil {
		return nil, op, err
	}
	if err := a.dir.removePendingKey(); err != nil {
		return nil, op, err
	}
	return st, answeredOp(op, previous, st.InstanceID), nil
}

// answeredOp names a successful rebind from the authority's answer: a
// valid certificate asks for a refresh, but the authority may answer it
// with a new instance (a resync, or the lost reply of a recovery), which
// the log must not call a refresh. An answer without an instance says
// nothing, and the name says so.
func answeredOp(asked, previous, answered string) string {
	switch {
	case asked == "recovery":
		return asked
	case answered == "":
		return "refresh or recovery"
	case answered != previous:
		return "recovery"
	}
	return "refresh"
}

// reasonChallengeFailed is DESIGN.md's word for a challenge not solved
// with the bound key.
const reasonChallengeFailed = "challenge_failed"

// retryableBound: besides transient failures, a spent recovery budget is
// worth retrying, since an operator raising the limit brings the agent
// back with no change on its side.
func retryableBound(err error) bool {
	return Transient(err) || spentBudget(err)
}

// spentBudget reports whether err is the refusal of a recovery for a
// spent budget: FAILED_PRECONDITION with the ErrorInfo reason
// recovery_exhausted. Not the message's words: a refusal with another
// reason whose message quoted them (a detail, a hint) was retried for
// good, and one whose message said it otherwise was not. An authority
// that sends no muster.dev ErrorInfo (one before the reasons) is matched
// on the word its message starts with, as it sends it.
func spentBudget(err error) bool {
	var se interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &se) || se.GRPCStatus().Code() != codes.FailedPrecondition {
		return false
	}
	word := boundkeypair.ErrRecoveryExhausted.Error()
	if reason := errinfo.Reason(err); reason != "" {
		return reason == word
	}
	return strings.HasPrefix(se.GRPCStatus().Message(), word)
}

// botAddAgain is the command that adds st's token again in place of the
// one deleted before it, with its settings: the recovery limit and mode
// the agent's join state carries and client,server if its certificate
// serves TLS (a token added again with bot add's defaults would have one
// recovery, which the join takes, and lose client,server). An agent with
// no join state (its first join refused) knows no settings but bot add's.
func botAddAgain(st *State, dir Dir) string {
	limit, mode, ok := boundkeypair.Settings(st.JoinState)
	if !ok {
		return "muster bot add " + st.BoundKeypair
	}
	return "muster bot add " + st.BoundKeypair + boundkeypair.BotAddFlags(limit, mode, certServesTLS(dir))
}

// certServesTLS reports whether the agent's certificate may serve TLS
// (its token's svid_usage is client,server); false if it cannot be read.
func certServesTLS(dir Dir) bool {
	b, err := readSmall(dir.CertFile())
	if err != nil {
		return false
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return false
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	return err == nil && slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
}

// boundRefusalHint adds to a refresh's or recovery's refusal the way out
// an operator takes, so the line agent run or agent renew ends (or, for a
// spent budget, retries) with says what to do, not only the reason word.
// The status code, its details and the reason word stay: the agent's
// retry test and tools matching on the reason still see them.
func boundRefusalHint(err error, st *State, dir Dir) error {
	s, ok := status.FromError(err)
	if !ok || err == nil {
		return err
	}
	reason := errinfo.Reason(err)
	if reason == "" {
		reason = s.Message()
	}
	var hint string
	if s.Code() == codes.NotFound && strings.HasPrefix(s.Message(), "unknown bound-keypair token") {
		// Its reason word is the code's (not_found): the message says which.
		reason = "unknown_token"
	}
	switch reason {
	case "unknown_token":
		hint = fmt.Sprintf("token %s was deleted, which ends refreshes (or names another node): on the authority, %s for a new registration secret, then here muster agent join --force --data %s --bound-keypair %s --registration-secret-file F",
			st.BoundKeypair, botAddAgain(st, dir), shellword.Quote(string(dir)), st.BoundKeypair)
	case boundkeypair.ErrRecoveryExhausted.Error():
		hint = fmt.Sprintf("the token's recovery budget is spent: on the authority, muster token get %s -o yaml > token.yaml, raise spec.bound_keypair.recovery.limit, muster token apply -f token.yaml; agent run retries by itself", st.BoundKeypair)
	case boundkeypair.ErrJoinStateStale.Error():
		hint = fmt.Sprintf("the join state was refused: muster audit list --action 'agent.*' says why and what to do (a stale one, the bound key in two places, locks token %s, and this machine is the holder left behind: muster lock delete ID only lets the other back in; to keep this machine, stop the other, then muster lock delete ID, muster token delete %s, %s, and here muster agent join --force --data %s --bound-keypair %s --registration-secret-file F; one ahead of the store, restored from a backup: %s)",
			st.BoundKeypair, st.BoundKeypair, botAddAgain(st, dir), shellword.Quote(string(dir)), st.BoundKeypair, boundkeypair.ResyncCommand)
	case reasonChallengeFailed:
		hint = fmt.Sprintf("this machine's bound key is not the one token %s is bound to: compare muster agent status --data %s (key SHA256:…) with muster token get %s on the authority (bound key); a directory restored from a backup taken before a rotation, or a wrong key, cannot prove it: to make this machine the node again, muster token delete %s, %s, and here muster agent join --force --data %s --bound-keypair %s --registration-secret-file F; the authority's store restored from a backup taken before this machine's rotation: %s (muster audit list --action 'agent.*' says when a window would rebind it)",
			st.BoundKeypair, shellword.Quote(string(dir)), st.BoundKeypair, st.BoundKeypair, botAddAgain(st, dir), shellword.Quote(string(dir)), st.BoundKeypair, boundkeypair.ResyncCommand)
	case "registration_closed":
		hint = fmt.Sprintf("the registration secret is used or past its deadline (muster token get %s shows it): on the authority, muster token delete %s and %s for a new secret", st.BoundKeypair, st.BoundKeypair, botAddAgain(st, dir))
	case "locked", "copy_detected":
		hint = fmt.Sprintf("muster lock list names the lock: find the copy if the reason says copy_detected, then muster lock delete ID; an instance lock is left behind by a recovery, which this agent makes with its bound key once its certificate has expired; agent run asks again by itself when a lock ends (its TTL), %s for one without a TTL, and recovers at the expiry, with no restart", every(lockedRecheck))
	default:
		return err
	}
	return withHint(err, hint)
}
