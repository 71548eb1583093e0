package enroll

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/jointoken"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
)

// Reasons of bound-keypair refusals, as DESIGN.md's table names them.
const (
	ReasonChallengeFailed    = "challenge_failed"
	ReasonRegistrationClosed = "registration_closed"
	ReasonRecoveryExhausted  = "recovery_exhausted"
	ReasonJoinStateMismatch  = "join_state_mismatch"
)

// ReasonUnknownBoundToken refuses a bound-keypair join or refresh whose
// token does not exist (never did, or was deleted) or is not for the
// node: alike on purpose.
const ReasonUnknownBoundToken = "unknown bound-keypair token, or not for this node"

// ReasonChallengeRequired refuses a plain renewal (RequestCertificate over
// mTLS) of a bound-keypair instance: its proof is the bound key, so it
// refreshes only by the challenge, which checks the token, the binding and
// the locks; a copied certificate key alone must not keep it alive.
const ReasonChallengeRequired = "a bound-keypair agent refreshes by repeating the challenge with its bound key, not by a plain renewal"

// BoundKeypairConfig is the bound-keypair method's configuration. The
// registration secrets are opened with the Service's TokenSealer.
type BoundKeypairConfig struct {
	// JoinStateSealer seals the join-state keys (purpose
	// seal.InfoJoinState) and opens the sealed ones; without it (and
	// without JoinStateCustody) every bound-keypair join fails.
	JoinStateSealer *seal.Sealer
	// JoinStateCustody, if set, makes the new join-state keys and opens
	// each existing one where its reference says (custody.ByRef: a PKCS#11
	// token's, and sealed ones with a custody.Sealed of JoinStateSealer
	// and no prefix); nil is sealed with JoinStateSealer.
	JoinStateCustody custody.Custody
	// Observer, if set, is told the recoveries a standard-mode token has
	// left after each bound-keypair join or refresh.
	Observer func(token string, remaining int64)
	// WarnAt is the low-budget threshold: a recovery that takes one of a
	// standard-mode budget and leaves WarnAt or fewer is audited
	// (token.recoveries_low) and Low is called; negative disables it.
	WarnAt int64
	Low    func(token, nodeID string, remaining int64)
	// Ahead, if set, is told of a join state refused as ahead of the
	// store outside a resync window: the sign of a store restored from a
	// backup, for the operator's log.
	Ahead func(token, nodeID string)
	// CertTTL is the lifetime of bound-keypair agents' certificates:
	// shorter than others' (DefaultBoundKeypairCertTTL), since a
	// bound-keypair agent that misses a refresh recovers with its key.
	// Zero means the default.
	CertTTL time.Duration
	// ChallengeTTL is how long a challenge is valid, and so how long the
	// exchange waits for its answer: zero (or over
	// boundkeypair.ChallengeTTL, DESIGN.md's minute) means that minute.
	ChallengeTTL time.Duration
}

// ChallengeLifetime is the lifetime of the method's challenges.
func (c BoundKeypairConfig) ChallengeLifetime() time.Duration {
	if c.ChallengeTTL <= 0 || c.ChallengeTTL > boundkeypair.ChallengeTTL {
		return boundkeypair.ChallengeTTL
	}
	return max(c.ChallengeTTL, time.Second)
}

// ErrNotAnsweredInTime is what a Challenge (or NewKey) returns when the
// caller sent nothing within the challenge's lifetime: a refusal answered
// DEADLINE_EXCEEDED and audited, which ends the exchange.
var ErrNotAnsweredInTime = errors.New("enroll: not answered within the challenge's lifetime")

// BoundKeypairPayload is the init message of a bound-keypair join.
type BoundKeypairPayload struct {
	Token  string // the token's name
	NodeID string
	CSR    []byte // required: the certificate's key, not the bound key
	// JoinState is the last join state document the agent received, ""
	// before its first join.
	JoinState string
	// PublicKey (authorized_keys) and RegistrationSecret bind a key to a
	// token that has none yet.
	PublicKey          string
	RegistrationSecret string
	// NewPublicKey (authorized_keys) asks to rotate the bound key to it in
	// this join; NewKey, if set, is how the authority asks the agent for a
	// new key when the token's rotate_after has passed. An agent that
	// offers neither keeps its key and is asked again at its next join.
	NewPublicKey string
	NewKey       func(ctx context.Context) (string, error)
	// Cert is the caller's verified agent certificate, if it presented
	// one: with a valid certificate of the current instance the join is a
	// refresh.
	Cert *x509.Certificate
}

// BoundKeypairResult is an identity and the join state document that goes
// with it.
type BoundKeypairResult struct {
	*Issued
	JoinState string
	// Remaining is the recoveries left under standard mode, -1 otherwise.
	Remaining int64
	// BoundKey is the fingerprint of the key bound after this join: the
	// new one if it rotated.
	BoundKey string
}

// bkMethod is the bound-keypair Method. out carries what the entry point
// needs after the common tail to sign the join state.
type bkMethod struct {
	s   *Service
	out *bkOutcome
}

type bkOutcome struct {
	token    store.Token
	key      boundkeypair.PublicKey
	sequence int64                 // the token's sequence once the join commits
	epoch    string                // and its epoch
	counted  bool                  // the join took one of the budget
	resync   *boundkeypair.Verdict // the join brings a restored token forward
	retry    bool
	rotated  bool                   // the bound key was rotated to key
	proved   boundkeypair.PublicKey // the key the first challenge proved; in a rebind, the key replaced
	rebound  bool                   // the resync rebound the token from proved to key
}

// RegisterUsingBoundKeypair admits, refreshes or recovers an agent whose
// proof is the bound Ed25519 key, over the challenge exchange ch. The
// checks run in this order: fields well-formed; the source's rate limit;
// the token known, of this method and for this node (NOT_FOUND alike
// otherwise); the key (the bound one, or one bound now with the
// registration secret while the window is open); the challenge solved with
// that key; locks on the node, the token and the keys; the join state and
// the recovery rules of the token's mode (a stale join state locks the
// token); and at the write, the key binding and the recovery as
// conditional claims.
func (s *Service) RegisterUsingBoundKeypair(ctx context.Context, r Request, p BoundKeypairPayload, ch Challenge) (*BoundKeypairResult, error) {
	if ch == nil {
		return nil, errors.New("enroll: a bound-keypair join needs a challenge exchange")
	}
	out := &bkOutcome{}
	iss, err := join(ctx, s, bkMethod{s: s, out: out}, r, p, ch)
	if err != nil {
		return nil, err
	}
	bk := out.token.BoundKeypair
	if iss.Retry && !out.retry {
		// The write found this the repeat of a join it already answered
		// (same node and certificate key, inside the retry window) and
		// applied none of this join's claims: the recovery, and any
		// rotation, did not happen, and the join state must say so.
		out.sequence, out.epoch, out.counted, out.resync = bk.RecoverySequence, bk.Epoch, false, nil
		if out.rotated || out.rebound {
			out.key, out.rotated, out.rebound = out.proved, false, false
		}
	}
	js := boundkeypair.JoinState{
		Issuer: s.cfg.AuthorityID, Token: out.token.ID, NodeID: iss.NodeID, IssuedAt: s.cfg.Now().Truncate(time.Second),
		InstanceID: iss.InstanceID, BoundKey: out.key.Fingerprint(), RecoverySequence: out.sequence,
		RecoveryLimit: bk.Spec.RecoveryLimit, RecoveryMode: bk.Spec.RecoveryMode, Epoch: out.epoch,
		TokenCreated: out.token.CreatedAt.Truncate(time.Microsecond).UTC(),
	}
	doc, err := s.signJoinState(ctx, js)
	if err != nil {
		return nil, err
	}
	s.issued.add(doc, js)
	res := &BoundKeypairResult{Issued: iss, JoinState: doc, Remaining: -1, BoundKey: out.key.Fingerprint()}
	if out.resync != nil {
		// Committed: as with the warning below, the record cannot cost
		// the agent its answer (the authority's auditor logs a failure).
		_ = s.auditResync(ctx, out, iss.NodeID)
	}
	if bk.Spec.RecoveryMode == boundkeypair.ModeStandard {
		// The count as the join's write left it: read before the join, plus
		// the recovery it took.
		count := bk.RecoveryCount
		if out.counted {
			count++
		}
		res.Remaining = boundkeypair.Status{Limit: bk.Spec.RecoveryLimit, Count: count}.Remaining()
		if s.cfg.BoundKeypair.Observer != nil {
			s.cfg.BoundKeypair.Observer(out.token.ID, res.Remaining)
		}
		// The join is committed: the agent must not lose its certificate
		// over the warning's audit record (Low has logged the warning).
		_ = s.warnLowBudget(ctx, out, iss.NodeID, res.Remaining)
	}
	return res, nil
}

// warnLowBudget audits a counted recovery that left the token's budget at
// or under the threshold, so an operator hears of it before the agent is
// refused recovery_exhausted. Refreshes and repeats take nothing and say
// nothing.
func (s *Service) warnLowBudget(ctx context.Context, out *bkOutcome, nodeID string, remaining int64) error {
	c := s.cfg.BoundKeypair
	if !out.counted || out.retry || c.WarnAt < 0 || remaining > c.WarnAt {
		return nil
	}
	if c.Low != nil {
		c.Low(out.token.ID, nodeID, remaining)
	}
	return s.cfg.Audit.Record(ctx, audit.Event{Actor: "authority", Action: "token.recoveries_low", Target: "token " + out.token.ID,
		Result: audit.ResultOK, Reason: fmt.Sprintf("node %s: %d of %d recoveries left (warning at %d or fewer); raise spec.bound_keypair.recovery.limit if recoveries are expected",
			nodeID, remaining, out.token.BoundKeypair.Spec.RecoveryLimit, c.WarnAt)})
}

func (s *Service) signJoinState(ctx context.Context, js boundkeypair.JoinState) (string, error) {
	k, err := s.joinStateKeys().current(ctx)
	if err != nil {
		return "", err
	}
	return k.Sign(js)
}

// reasonJoinTokenAsName refuses a join token given as a bound-keypair
// token's name; it names the way out and never the value.
const reasonJoinTokenAsName = "token: a join token (ID.SECRET) is not a bound-keypair token name; join with it as a join token (muster agent join --token TOKEN), or give the name muster bot add printed; the value was not recorded"

// Attest implements Method.
func (m bkMethod) Attest(ctx context.Context, r Request, p BoundKeypairPayload, challenge Challenge) (Admission, error) {
	s := m.s
	a := Admission{NodeID: p.NodeID}
	// 1. Fields well-formed.
	if err := spiffeid.ValidNodeID(p.Token); err != nil {
		a.NodeID = ""
		return a, refuse(KindInvalid, "token: "+err.Error())
	}
	// A join token pasted as the name holds its secret: refused before
	// it names the actor or reaches any record (no bound-keypair token is
	// named so: the admin API refuses such names).
	if jointoken.LooksLike(p.Token) {
		return a, refuse(KindInvalid, reasonJoinTokenAsName)
	}
	a.Actor = "bound-keypair:" + p.Token
	// A valid certificate this authority issued for the node asks for a
	// refresh: its refusals before the store says whether it is the
	// current instance's are a refresh's. Any other (one signed elsewhere,
	// or another node's) proves nothing: its refusals are a join's.
	a.refreshing = s.agentCertOf(p.Cert, p.NodeID)
	if err := spiffeid.ValidNodeID(p.NodeID); err != nil {
		a.NodeID = ""
		return a, refuse(KindInvalid, "node_id: "+err.Error())
	}
	if len(p.CSR) == 0 {
		return a, refuse(KindInvalid, "csr is required")
	}
	csr, err := ca.ParseCSR(p.CSR)
	if err != nil {
		return a, refuse(KindInvalid, "csr: "+err.Error())
	}
	kid, err := keyID(csr.PublicKey)
	if err != nil {
		return a, err
	}
	var offered boundkeypair.PublicKey
	if p.PublicKey != "" {
		if offered, err = boundkeypair.ParsePublicKey(p.PublicKey); err != nil {
			return a, refuse(KindInvalid, "public_key: "+err.Error())
		}
	}
	var offeredNew boundkeypair.PublicKey
	if p.NewPublicKey != "" {
		if offeredNew, err = boundkeypair.ParsePublicKey(p.NewPublicKey); err != nil {
			return a, refuse(KindInvalid, "new_public_key: "+err.Error())
		}
	}
	// 2. The source's rate limit.
	if s.cfg.Limiter != nil && !s.cfg.Limiter.Allow(r.Source) {
		return a, refuse(KindRateLimited, "too many requests from this source")
	}
	// 3. The token: known, of this method, for this node; alike otherwise.
	notFound := refuse(KindNotFound, ReasonUnknownBoundToken)
	rd, err := s.cfg.Store.ReadJoin(ctx, p.Token, "", nil)
	t := rd.Token
	switch {
	case err != nil:
		return a, err
	case !rd.TokenFound:
		flags, known := s.deletedTokenFlags(ctx, p)
		return a, notFound.with("no token %s; %s", p.Token, deletedTokenWayOut(p.Token, p.NodeID, flags, known))
	case t.JoinMethod != store.JoinMethodBoundKeypair || t.BoundKeypair == nil:
		return a, notFound.with("token %s is a %s token", t.ID, t.JoinMethod)
	case t.NodeID != p.NodeID:
		return a, notFound.with("token %s is for node %s", t.ID, t.NodeID)
	}
	bk := t.BoundKeypair
	now := s.cfg.Now()

	// 4. The key to challenge: the bound one, or the offered one with the
	// registration secret while none is bound.
	var (
		key      boundkeypair.PublicKey
		claims   []store.Claim
		register bool
	)
	// A resync window may have the key the agent's join state names
	// challenged instead (the agent rotated or registered after the
	// backup the store was restored from); the binding then changes in
	// this join's write, from the key (or no key) the store holds.
	rebind, ep, noRebind, err := s.rebindable(ctx, t, p, offered, now)
	if err != nil {
		return a, err
	}
	var bound boundkeypair.PublicKey
	if bk.BoundPublicKey != "" {
		if bound, err = boundkeypair.ParsePublicKey(bk.BoundPublicKey); err != nil {
			return a, fmt.Errorf("enroll: token %s: stored key: %w", t.ID, err)
		}
	}
	if rebind != nil {
		key = offered
		claims = append(claims, store.KeyBinding{TokenID: t.ID, Expected: bk.BoundPublicKey, PublicKey: key.String(),
			Rotate: bk.BoundPublicKey != "", DropRegistrationSecret: bk.BoundPublicKey == ""})
	} else if bk.BoundPublicKey != "" {
		if p.RegistrationSecret != "" && !offered.IsZero() && offered.String() != bound.String() {
			// The secret binds a key only while none is bound: another
			// key presented with it (a second machine given the same
			// secret) is told so, not sent to fail a challenge meant for
			// the bound key. The same key with the secret is the
			// registered agent repeating its join.
			return a, refuse(KindFailedPrecondition, ReasonRegistrationClosed).with("token %s: key %s is bound; a registration secret (used, or never issued) binds no other (offered %s); %s",
				t.ID, bound.Fingerprint(), offered.Fingerprint(), newSecretWayOut(t.ID, t.NodeID, botAddFlags(t)))
		}
		key = bound
	} else {
		switch {
		case bk.SecretCiphertext == nil:
			return a, refuse(KindFailedPrecondition, ReasonRegistrationClosed).with("token %s: no key bound and the registration secret is used; %s", t.ID, newSecretWayOut(t.ID, t.NodeID, botAddFlags(t)))
		case !bk.Spec.MustRegisterBefore.IsZero() && !now.Before(bk.Spec.MustRegisterBefore):
			return a, refuse(KindFailedPrecondition, ReasonRegistrationClosed).with("token %s: must register before %s; %s",
				t.ID, bk.Spec.MustRegisterBefore.Format(time.RFC3339), newSecretWayOut(t.ID, t.NodeID, botAddFlags(t)))
		case offered.IsZero() || p.RegistrationSecret == "":
			r := refuse(KindInvalid, "token has no key bound yet: registration_secret and public_key are required")
			if noRebind == restoreHint {
				r = r.with("token %s: %s", t.ID, noRebind)
			}
			return a, r
		}
		secret, err := s.cfg.TokenSealer.Open(bk.SecretCiphertext, bk.SecretNonce, []byte(t.ID))
		if err != nil {
			return a, fmt.Errorf("enroll: token %s: registration secret: %w", t.ID, err)
		}
		if subtle.ConstantTimeCompare(secret, []byte(p.RegistrationSecret)) != 1 {
			return a, refuse(KindUnauthenticated, ReasonChallengeFailed).with("token %s: wrong registration secret", t.ID)
		}
		key, register = offered, true
		claims = append(claims, store.KeyBinding{TokenID: t.ID, PublicKey: key.String(), UseRegistrationSecret: true})
	}
	fp := key.Fingerprint()

	// 5. The challenge, solved with that key.
	c, err := boundkeypair.NewChallengeFor(s.cfg.AuthorityID, now, s.cfg.BoundKeypair.ChallengeLifetime())
	if err != nil {
		return a, err
	}
	answer, err := challenge(ctx, c.Marshal())
	if err != nil {
		// The caller ended the stream, or sent something else, instead of
		// an answer: a refusal of its request, not the authority's fault;
		// or it went away, which is no refusal (notAnswered).
		return a, notAnswered("the challenge was not answered", err, t.ID)
	}
	if err := c.Verify(string(answer), key, s.cfg.Now()); err != nil {
		if noRebind != "" {
			// The offered key was not the one challenged: tell the
			// operator why (inside a window), or that a window would
			// have let it rebind (outside one).
			err = fmt.Errorf("%w (%s)", err, noRebind)
		}
		return a, refuse(KindUnauthenticated, ReasonChallengeFailed).with("token %s, key %s: %v; %s", t.ID, fp, err, otherKeyWayOut(t.ID, t.NodeID, botAddFlags(t)))
	}

	// 6. Whether this is a refresh (a valid certificate of the current
	// instance), read with the locks in one query: on the node, the token
	// and the keys (the bound one, the certificate's, a new bound key
	// offered in init) and, for a refresh, on the instance and the key it
	// holds, which the renewal then need not look up again. Before the
	// join state: once a token is locked, every holder hears so.
	targets := []store.LockTarget{{Kind: store.LockNode, Target: p.NodeID}, {Kind: store.LockToken, Target: t.ID},
		{Kind: store.LockPublicKey, Target: fp}, keyLock(kid)}
	if !offeredNew.IsZero() && !register {
		targets = append(targets, store.LockTarget{Kind: store.LockPublicKey, Target: offeredNew.Fingerprint()})
	}
	if rebind != nil && !bound.IsZero() {
		// The key the rebind replaces: a lock on it still holds.
		targets = append(targets, store.LockTarget{Kind: store.LockPublicKey, Target: bound.Fingerprint()})
	}
	held, err := s.holdsCurrent(ctx, p.Cert, p.NodeID, bk.BoundInstanceID, targets)
	if err != nil {
		// Not knowing must not turn a refresh into a counted recovery.
		return a, err
	}
	a.refreshing = held != nil
	var l *store.Lock
	// ReadRenewal's node is the record's (the join's) and its token the
	// instance's: when that is this token, as a refresh's is, the lock
	// read covers every target of the join's.
	if held != nil {
		targets = append(targets, held.lockTargets()...)
	}
	if held != nil && held.inst.TokenID == t.ID {
		l = held.lock
	} else if l, err = s.lockOn(ctx, targets...); err != nil {
		return a, err
	}
	if l != nil {
		return a, s.lockedOn(ctx, targets, *l, "token %s, lock %s on %s %s", t.ID, l.ID, l.Kind, l.Target)
	}

	// 7. The join state and the recovery rules.
	st := boundkeypair.Status{Mode: bk.Spec.RecoveryMode, Limit: bk.Spec.RecoveryLimit, Count: bk.RecoveryCount,
		Sequence: bk.RecoverySequence, Epoch: bk.Epoch, Created: t.CreatedAt}
	att := boundkeypair.Attempt{Refresh: held != nil}
	if rebind != nil {
		att.State, att.Rebind = rebind, true
	} else if js, ok := s.issued.lookup(p.JoinState); ok && js.Issuer == s.cfg.AuthorityID && js.Token == t.ID && js.NodeID == p.NodeID {
		// Exactly a document this process signed for this token and node.
		att.State = &js
	} else if p.JoinState != "" {
		js, err := boundkeypair.VerifyJoinState(p.JoinState, s.joinStateKeys().lookup(ctx), s.cfg.AuthorityID, t.ID, p.NodeID)
		if err != nil {
			att.StateErr = err
		} else {
			att.State = &js
		}
	}
	// A lost reply of a recovery: the agent presents the join state from
	// before it, for the instance that recovery made, within the retry
	// window, with the same certificate key. It gets that answer again
	// rather than a lock.
	if att.State != nil && att.State.RecoverySequence == st.Sequence-1 && !att.Refresh && !att.Rebind {
		if iss, err := s.retryRecovery(ctx, p.NodeID, bk.BoundInstanceID, t.ID, kid, now); err != nil || iss != nil {
			if iss != nil {
				*m.out = bkOutcome{token: t, key: key, sequence: st.Sequence, epoch: st.Epoch, retry: true}
				a.Retry = iss
			}
			return a, err
		}
	}
	if !att.Clean(st) && !att.Rebind && ep.Ordinal == nil {
		// Every join but a refresh with the current document may need
		// the epochs: a recovery records the current one. Unless
		// rebindable read them already (epochs always makes Ordinal):
		// a join that offered a key the window did not rebind.
		if ep, err = s.epochs(ctx, now); err != nil {
			return a, err
		}
	}
	v, err := boundkeypair.Judge(st, att, ep)
	switch {
	case errors.Is(err, boundkeypair.ErrJoinStateStale):
		return a, s.lockStale(ctx, t.ID, p.NodeID, botAddFlags(t), err)
	case errors.Is(err, boundkeypair.ErrJoinStateInvalid):
		if mm := (*boundkeypair.Mismatch)(nil); errors.As(err, &mm) && mm.Ahead && s.cfg.BoundKeypair.Ahead != nil {
			s.cfg.BoundKeypair.Ahead(t.ID, p.NodeID)
		}
		return a, refuse(KindPermissionDenied, ReasonJoinStateMismatch).with("token %s: %v", t.ID, err)
	case errors.Is(err, boundkeypair.ErrRecoveryExhausted):
		return a, refuse(KindFailedPrecondition, ReasonRecoveryExhausted).with("token %s: %v; %s", t.ID, err, raiseLimitWayOut(t.ID))
	case err != nil:
		return a, err
	}
	// A current certificate with a join state the rules take as a
	// recovery (a resync): its later refusals are a recovery's, as its
	// record would be.
	a.refreshing = !v.Recovery

	*m.out = bkOutcome{token: t, key: key, sequence: st.Sequence, epoch: st.Epoch}
	if v.Rebind {
		m.out.rebound, m.out.proved = true, bound
	}
	// 8. Rotation: asked by the agent, or due by the token's rotate_after;
	// the new key must solve a challenge of its own, and the binding
	// changes only in this join's write, from the key just proved. Not in
	// a rebind, whose key the agent has just rotated (or registered) to.
	if !register && !v.Rebind {
		next, err := m.rotation(ctx, t, p, offeredNew, key, now, challenge)
		if err != nil {
			return a, err
		}
		if !next.IsZero() {
			targets = append(targets, store.LockTarget{Kind: store.LockPublicKey, Target: next.Fingerprint()})
			claims = append(claims, store.KeyBinding{TokenID: t.ID, Expected: bk.BoundPublicKey, PublicKey: next.String(), Rotate: true})
			m.out.proved, m.out.key, m.out.rotated = key, next, true
		}
	}
	if !v.Recovery {
		// A refresh: the instance is renewed; nothing is consumed. Its
		// write holds only while the token still exists and is bound to
		// the key just proved (a deletion or a rotation between the read
		// and the write refuses it): the binding's own claim says so, or
		// one that binds the key to itself.
		if len(claims) == 0 {
			claims = append(claims, store.KeyBinding{TokenID: t.ID, Expected: bk.BoundPublicKey, PublicKey: bk.BoundPublicKey})
		}
		if held != nil {
			held.serverAuth = t.SVIDUsage == store.SVIDUsageClientServer
			held.targets = targets
			held.flags = botAddFlags(t)
			if m.out.rotated {
				// The binding changes in this refresh's write: its
				// audit record says so, as a recovery's does.
				held.note = fmt.Sprintf(", bound key %s rotated to %s", fp, m.out.key.Fingerprint())
			}
		}
		a.Refresh, a.CSR, a.Claims, a.held = p.Cert, p.CSR, claims, held
		return a, nil
	}
	m.out.sequence, m.out.epoch, m.out.counted = v.Sequence, v.Epoch, v.Counted
	claims = append(claims, store.Recovery{TokenID: t.ID, ExpectedSequence: v.ExpectedSequence, ExpectedEpoch: v.ExpectedEpoch,
		Counted: v.Counted, Epoch: v.Epoch, Sequence: v.Sequence, Resync: v.Resync})
	a.TokenID, a.Method, a.MaySupersede = t.ID, store.JoinMethodBoundKeypair, true
	a.botAddFlags = botAddFlags(t)
	a.ServerAuth = t.SVIDUsage == store.SVIDUsageClientServer
	a.Proof = fmt.Sprintf("bound key %s, recovery %d of token %s", fp, v.Sequence, t.ID)
	if v.Resync {
		m.out.resync = &v
		a.Proof = fmt.Sprintf("bound key %s, token %s resynced in epoch %q from sequence %d (epoch %q) to %d after a join state of epoch %q at %d",
			fp, t.ID, v.Epoch, v.ExpectedSequence, v.ExpectedEpoch, v.Sequence, att.State.Epoch, att.State.RecoverySequence)
	}
	if v.Rebind {
		a.Proof += fmt.Sprintf(", rebound from %s", fingerprintOr(bound))
	}
	if register {
		a.Proof = fmt.Sprintf("bound key %s registered with the secret of token %s", fp, t.ID)
	}
	if m.out.rotated {
		a.Proof += fmt.Sprintf(", key rotated to %s", m.out.key.Fingerprint())
	}
	a.PublicKey, a.KeyID, a.Now, a.Claims, a.LockTargets = csr.PublicKey, kid, now, claims, store.Named(targets)
	return a, nil
}

// agentCertOf reports whether cert is valid now, signed by one of this
// authority's accepted agent intermediates, and names nodeID as its
// agent identity in this trust domain: what the mTLS handshake and the
// agent rule check at the service layer, checked again here since the
// label of a refusal must not rest on what a caller merely presents.
func (s *Service) agentCertOf(cert *x509.Certificate, nodeID string) bool {
	if cert == nil || s.cfg.Now().After(cert.NotAfter) {
		return false
	}
	id, err := spiffeid.FromCertificate(cert)
	if err != nil || id.Role != spiffeid.RoleAgent || id.Name != nodeID || id.TrustDomain != s.cfg.TrustDomain {
		return false
	}
	for _, c := range s.cfg.CA.Accepted(ca.RoleAgent) {
		if cert.CheckSignatureFrom(c) == nil {
			return true
		}
	}
	return false
}

// rotation returns the key to rotate the token's binding to, proved by a
// second challenge, or the zero key when there is no rotation: the agent
// offered none and either rotate_after has not passed, the key was
// rotated since, or the agent cannot be asked.
func (m bkMethod) rotation(ctx context.Context, t store.Token, p BoundKeypairPayload, offered, current boundkeypair.PublicKey, now time.Time, challenge Challenge) (boundkeypair.PublicKey, error) {
	var none boundkeypair.PublicKey
	bk := t.BoundKeypair
	asked := offered.IsZero()
	if asked {
		if !boundkeypair.RotationDue(bk.Spec.RotateAfter, bk.LastRotatedAt, now) || p.NewKey == nil {
			return none, nil
		}
		text, err := p.NewKey(ctx)
		if err != nil {
			return none, notAnswered("the new key was not sent", err, t.ID)
		}
		if offered, err = boundkeypair.ParsePublicKey(text); err != nil {
			return none, refuse(KindInvalid, "new_public_key: "+err.Error())
		}
	}
	if offered.String() == current.String() {
		return none, refuse(KindInvalid, "new_public_key is the key already bound")
	}
	fp := offered.Fingerprint()
	c, err := boundkeypair.NewChallengeFor(m.s.cfg.AuthorityID, now, m.s.cfg.BoundKeypair.ChallengeLifetime())
	if err != nil {
		return none, err
	}
	answer, err := challenge(ctx, c.Marshal())
	if err != nil {
		return none, notAnswered("the new key's challenge was not answered", err, t.ID)
	}
	if err := c.Verify(string(answer), offered, m.s.cfg.Now()); err != nil {
		return none, refuse(KindUnauthenticated, ReasonChallengeFailed).with("token %s, new key %s: %v", t.ID, fp, err)
	}
	if asked {
		// A key offered in init was in step 6's lock query.
		target := store.LockTarget{Kind: store.LockPublicKey, Target: fp}
		if l, err := m.s.lockOn(ctx, target); err != nil {
			return none, err
		} else if l != nil {
			return none, m.s.lockedOn(ctx, []store.LockTarget{target}, *l, "token %s, lock %s on the new key %s", t.ID, l.ID, fp)
		}
	}
	return offered, nil
}

// held is what holdsCurrent read of a refreshing caller's certificate,
// instance and node; the renewal starts from it instead of reading them
// again.
type held struct {
	rec       store.Certificate
	inst      store.Instance
	node      store.Node
	nodeFound bool
	// lock is the lock in force on the renewal's targets and the public
	// keys among the join's (nil for none), read with the rest.
	lock *store.Lock
	// serverAuth is the token's svid_usage as read by this refresh: a
	// bound-keypair token stays its agent's policy, so a change by token
	// apply takes effect at the next refresh (a plain renewal keeps the
	// usage of the certificate it renews; its token may be long gone).
	serverAuth bool
	// signerSet is the verifier set's ID, read with the rest: the
	// answer carries its set.
	signerSet store.SignerSetID
	// targets are the join's lock targets the refresh checked besides the
	// renewal's (the bound keys, the token): its write is refused by a
	// lock created on one since.
	targets []store.LockTarget
	// flags are the muster bot add flags of the token's settings, for the
	// way out if it is deleted before the refresh's write.
	flags string
	// note is added to the refresh's audit reason: what it changed
	// besides the certificate (a rotation of the bound key).
	note string
}

// lockTargets are the locks a renewal checks beyond the join's: the
// instance, its token and the key the caller's certificate holds.
func (h *held) lockTargets() []store.LockTarget {
	return []store.LockTarget{{Kind: store.LockInstance, Target: h.inst.ID}, {Kind: store.LockToken, Target: h.inst.TokenID},
		keyLock(h.rec.PublicKey)}
}

// holdsCurrent returns what it read if cert is a certificate this
// authority issued for nodeID's instance instanceID, which is still
// current; nil if not, and an error only when the store could not tell.
// One read (ReadRenewal) brings the record, the instance, the node and
// the lock in force on the renewal's targets and the public keys among
// targets (the join's).
func (s *Service) holdsCurrent(ctx context.Context, cert *x509.Certificate, nodeID, instanceID string, targets []store.LockTarget) (*held, error) {
	if cert == nil || instanceID == "" || s.cfg.Now().After(cert.NotAfter) {
		return nil, nil
	}
	var keys []string
	for _, t := range targets {
		if t.Kind == store.LockPublicKey {
			keys = append(keys, t.Target)
		}
	}
	rd, err := s.cfg.Store.ReadRenewal(ctx, serialOf(cert), keys)
	switch {
	case err != nil:
		return nil, err
	case !rd.CertificateFound, rd.Certificate.NodeID != nodeID, rd.Certificate.InstanceID != instanceID,
		!rd.InstanceFound, rd.Instance.State != store.InstanceCurrent:
		return nil, nil
	}
	h := &held{rec: rd.Certificate, inst: rd.Instance, node: rd.Node, nodeFound: rd.NodeFound, signerSet: rd.SignerSet}
	if rd.Locked {
		h.lock = &rd.Lock
	}
	return h, nil
}

// retryRecovery answers a repeated recovery from the instance it made, or
// returns nil if the request is not such a repeat.
func (s *Service) retryRecovery(ctx context.Context, nodeID, instanceID, tokenID string, kid []byte, now time.Time) (*Issued, error) {
	node, err := s.cfg.Store.GetNode(ctx, nodeID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	if node.InstanceID != instanceID {
		return nil, nil
	}
	inst, err := s.cfg.Store.GetInstance(ctx, instanceID)
	if err != nil {
		return nil, err
	}
	if inst.State != store.InstanceCurrent || inst.Generation != 0 || inst.TokenID != tokenID ||
		!hmac.Equal(inst.LastPublicKey, kid) || now.Sub(inst.CreatedAt) > s.cfg.RetryWindow {
		return nil, nil
	}
	return s.retryJoin(ctx, node, tokenID, kid, now, store.LockTarget{Kind: store.LockToken, Target: tokenID})
}

// lockStale locks the token whose join state was presented stale: the
// keypair is in two places, and the authority cannot tell which holder is
// genuine, so both are refused from now on.
//
// The lock's ID is the token's (staleLockID), so the insert is the one
// conditional write: of racing stale presentations, on any number of
// replicas, exactly one writes the lock and audits it, and the others,
// finding it there (ErrConflict), are refused by it. Unlocking is one
// `lock delete`.
func (s *Service) lockStale(ctx context.Context, tokenID, nodeID, flags string, cause error) error {
	reason := fmt.Sprintf("join_state_mismatch: node %s presented a stale join state (%v)", nodeID, cause)
	l := store.Lock{ID: staleLockID(tokenID), Kind: store.LockToken, Target: tokenID, Reason: reason, CreatedBy: "authority", CreatedAt: s.cfg.Now()}
	// The lock goes in with its record, or neither does: the one that
	// wins writes both.
	link, err := s.cfg.Audit.Builder(audit.Event{Actor: "authority", Action: "lock.create", Target: "token " + tokenID,
		Result: audit.ResultOK, Reason: reason})
	if err != nil {
		return err
	}
	err = s.cfg.Store.InsertLock(ctx, l, link.Build)
	if errors.Is(err, store.ErrConflict) {
		return refuse(KindPermissionDenied, ReasonJoinStateMismatch).with("token %s locked by %s: %v; %s", tokenID, l.ID, cause, staleWayOut(tokenID, nodeID, l.ID, flags))
	}
	if err != nil {
		return err
	}
	s.cfg.Audit.Appended(link)
	return refuse(KindPermissionDenied, ReasonJoinStateMismatch).with("token %s locked by %s: %v; %s", tokenID, l.ID, cause, staleWayOut(tokenID, nodeID, l.ID, flags))
}

// The ways out of bound-keypair refusals, for their audit records (the
// agent names the same on the line it ends with).
func newSecretWayOut(token, node, flags string) string {
	return fmt.Sprintf("a new registration secret: muster token delete %s, %s", token, botAdd(token, node, flags))
}

// deletedTokenWayOut is the way out of a refusal for a token that is gone:
// make it again, with the deleted token's settings when the caller showed
// them (known: the join state it presented, which the authority signed,
// and its certificate), then join the machine again with the new secret.
func deletedTokenWayOut(token, node, flags string, known bool) string {
	unknown := ""
	if !known {
		unknown = " (the deleted token's settings are not known here: add --recovery-limit N, --recovery-mode MODE, --svid-usage client,server if it had other than the defaults)"
	}
	return fmt.Sprintf("if it was deleted (which ends refreshes): %s%s, then on the machine muster agent join --force --data ADIR --bound-keypair %s --registration-secret-file FILE with the new registration secret",
		botAdd(token, node, flags), unknown, node)
}

// deletedTokenFlags are the muster bot add flags of a deleted token's
// settings as the caller shows them: the recovery limit and mode of a
// join state document this authority signed for the token and node, and
// client,server if the caller's certificate (this authority's, of the
// node) serves TLS. known is false without such a document.
func (s *Service) deletedTokenFlags(ctx context.Context, p BoundKeypairPayload) (flags string, known bool) {
	if p.JoinState == "" {
		return "", false
	}
	js, err := boundkeypair.VerifyJoinState(p.JoinState, s.joinStateKeys().lookup(ctx), s.cfg.AuthorityID, p.Token, p.NodeID)
	if err != nil {
		return "", false
	}
	return boundkeypair.BotAddFlags(js.RecoveryLimit, js.RecoveryMode, s.agentCertOf(p.Cert, p.NodeID) && servesTLS(p.Cert)), true
}

// botAdd is the command that makes node a new bound-keypair token in
// place of token, with flags (botAddFlags: the old token's settings). muster bot add NAME makes the token of node NAME, so it
// names the node: a token named otherwise (muster token apply) is
// replaced by one named after its node, which the agent then joins with.
func botAdd(token, node, flags string) string {
	if token == node {
		return "muster bot add " + node + flags
	}
	return fmt.Sprintf("muster bot add %s%s (the new token is named after its node: the agent joins with --bound-keypair %s, not %s)", node, flags, node, token)
}

// botAddFlags are the muster bot add flags that make a new token with
// t's settings where they are not bot add's defaults: a token deleted
// and added again with the defaults would have one recovery, which the
// first join takes, and lose client,server.
func botAddFlags(t store.Token) string {
	var b strings.Builder
	if bk := t.BoundKeypair; bk != nil {
		if bk.Spec.RecoveryLimit != boundkeypair.DefaultRecoveryLimit {
			fmt.Fprintf(&b, " --recovery-limit %d", bk.Spec.RecoveryLimit)
		}
		if m := bk.Spec.RecoveryMode; m != "" && m != boundkeypair.ModeStandard {
			fmt.Fprintf(&b, " --recovery-mode %s", m)
		}
	}
	if u := t.SVIDUsageOrDefault(); u != store.SVIDUsageClient {
		fmt.Fprintf(&b, " --svid-usage %s", u)
	}
	return b.String()
}

func raiseLimitWayOut(token string) string {
	return fmt.Sprintf("if the recovery is expected, raise the limit: muster token get %s -o yaml > token.yaml, edit spec.bound_keypair.recovery.limit, muster token apply -f token.yaml", token)
}

func otherKeyWayOut(token, node, flags string) string {
	return fmt.Sprintf("the caller holds another key than the token's (muster token get %s shows its fingerprint, muster agent status on the machine the agent's): a machine that should be the node joins again with a new token, muster token delete %s, %s", token, token, botAdd(token, node, flags))
}

// staleWayOut is what the operator does about a stale join state. The
// holder that presented it is behind for good (another holder recovered
// since, and only the newest document is accepted), so deleting the lock
// lets the other holder back and locks again at this one's next attempt;
// keeping this one means a new token (the stale lock outlives the token:
// it is deleted with it explicitly).
func staleWayOut(token, node, lockID, flags string) string {
	return fmt.Sprintf("the holder that presented it is behind another holder of the bound key, which recovered since: to keep the other, stop this one, then muster lock delete %s; to keep this one, stop the other, then muster lock delete %s, muster token delete %s, %s, and on this machine muster agent join --force with the new registration secret",
		lockID, lockID, token, botAdd(token, node, flags))
}

// staleLockID is the ID of the lock a stale join state puts on token: one
// per token, whatever presented it, so racing presentations write one row.
func staleLockID(token string) string {
	sum := sha256.Sum256([]byte("muster stale join state lock\x00" + token))
	return "lock-stale-" + hex.EncodeToString(sum[:6])
}

// notAnswered is the refusal of a caller that sent something else than
// what the exchange asked for; a caller that went away (its context ended)
// is no refusal, and its error is returned as it is.
func notAnswered(what string, err error, token string) error {
	if errors.Is(err, ErrNotAnsweredInTime) {
		return refuse(KindDeadlineExceeded, what+" in time").with("token %s: %v", token, err)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return refuse(KindInvalid, what+": "+err.Error()).with("token %s", token)
}
