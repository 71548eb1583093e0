package enroll

import (
	"time"

	"context"
	"crypto"
	"crypto/hmac"
	"crypto/sha256"
	"fmt"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/jointoken"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/trustbundle"
)

// TrustBundle returns the trust bundle as a JWS keyed by the secret of the
// token tokenID. An unknown ID gets a bundle keyed by a decoy key derived
// from the ID, so the answer says nothing about which tokens exist; only
// the token's holder can tell a real signature from a decoy.
func (s *Service) TrustBundle(ctx context.Context, r Request, tokenID string) (string, error) {
	if !jointoken.ValidID(tokenID) {
		return "", s.refuseBundle(ctx, r, refuse(KindInvalid, "token_id must be 6 characters of a-z 0-9"))
	}
	if s.cfg.Limiter != nil && !s.cfg.Limiter.Allow(r.Source) {
		return "", s.refuseBundle(ctx, r, refuse(KindRateLimited, "too many requests from this source"))
	}
	key := s.decoyKey(tokenID)
	rd, err := s.cfg.Store.ReadJoin(ctx, tokenID, "", nil)
	switch {
	case err != nil:
		return "", err
	case rd.TokenFound && rd.Token.JoinMethod == store.JoinMethodToken:
		tok, err := s.openToken(rd.Token)
		if err != nil {
			return "", err
		}
		key = trustbundle.Key(tok.ID, tok.Secret())
	}
	b := trustbundle.Bundle{
		AuthorityID: s.cfg.AuthorityID,
		TrustDomain: s.cfg.TrustDomain,
		Endpoints:   *s.endpoints.Load(),
	}
	// Every trusted root, the signing one first: during a root rotation
	// both, so a join pinned to either finds its own (DESIGN.md "Root
	// rotation").
	// An expired certificate is left out, as from the trust bundle of
	// every answer: the CA clock retires an expired intermediate only at
	// its next step.
	now := s.cfg.Now()
	for _, r := range s.cfg.CA.Roots().Trusted {
		if !now.After(r.NotAfter) {
			b.Roots = append(b.Roots, string(ca.EncodeCertPEM(r)))
		}
	}
	// Every server and bootstrap intermediate in the bundle (a prepared
	// successor included), so the agent can check the listener's chain
	// whichever one signed it.
	for _, role := range []ca.Role{ca.RoleServer, ca.RoleBootstrap} {
		for _, c := range s.cfg.CA.Accepted(role) {
			if !now.After(c.NotAfter) {
				b.Intermediates = append(b.Intermediates, string(ca.EncodeCertPEM(c)))
			}
		}
	}
	return trustbundle.Sign(b, tokenID, key, now)
}

func (s *Service) decoyKey(tokenID string) []byte {
	m := hmac.New(sha256.New, s.cfg.DecoyKey)
	m.Write([]byte(tokenID))
	return m.Sum(nil)
}

func (s *Service) refuseBundle(ctx context.Context, r Request, ref *Refusal) error {
	s.cfg.Audit.Refuse(ctx, audit.Event{Actor: "anonymous", Action: "trust_bundle.get", Result: audit.ResultDenied,
		Reason: ref.Reason, Source: r.Source, CorrelationID: r.CorrelationID})
	return ref
}

// decoyCompare does for a token that does not exist the work a wrong
// secret costs (a decryption and a constant-time comparison), so the time
// of the answer does not tell whether the ID exists.
func (s *Service) decoyCompare(tok jointoken.Token) {
	s.decoyOnce.Do(func() {
		d, err := jointoken.Generate()
		if err != nil {
			return
		}
		ct, nonce, err := s.cfg.TokenSealer.Seal(d.Secret(), []byte(d.ID))
		if err == nil {
			s.decoy = store.Token{ID: d.ID, Ciphertext: ct, Nonce: nonce}
		}
	})
	if stored, err := s.openToken(s.decoy); err == nil {
		stored.SecretEqual(tok.Secret())
	}
}

// openToken decrypts a stored token's secret.
func (s *Service) openToken(t store.Token) (jointoken.Token, error) {
	secret, err := s.cfg.TokenSealer.Open(t.Ciphertext, t.Nonce, []byte(t.ID))
	if err != nil {
		return jointoken.Token{}, fmt.Errorf("enroll: token %s: %w", t.ID, err)
	}
	return jointoken.New(t.ID, secret)
}

// TokenPayload is what a join-token join presents.
type TokenPayload struct {
	Token  string // id.secret
	NodeID string
	CSR    []byte // optional: without one the authority mints the key
}

// tokenMethod is the join-token Method. Its configuration is the
// Service's TokenSealer, which the trust bundle shares.
type tokenMethod struct{ s *Service }

// ExchangeJoinToken admits an agent with a join token. The checks run in
// the order of DESIGN.md's table, so a caller without the secret learns
// nothing about the token, and a refused attempt consumes nothing.
func (s *Service) ExchangeJoinToken(ctx context.Context, r Request, token, nodeID string, csrData []byte) (*Issued, error) {
	return join(ctx, s, tokenMethod{s}, r, TokenPayload{Token: token, NodeID: nodeID, CSR: csrData}, nil)
}

// reasonSwapped refuses a join whose node ID, not its token, has a join
// token's form.
const reasonSwapped = "join token is malformed, and node_id has the form of a join token: were the token and the node ID (--token and --node) swapped? The node_id was not recorded"

// Attest implements Method.
func (m tokenMethod) Attest(ctx context.Context, r Request, p TokenPayload, _ Challenge) (Admission, error) {
	s := m.s
	token, nodeID, csrData := p.Token, p.NodeID, p.CSR
	a := Admission{NodeID: nodeID}
	// 1. Fields present and well-formed.
	if token == "" || nodeID == "" {
		return a, refuse(KindInvalid, "join_token and node_id are required")
	}
	tok, err := jointoken.Parse(token)
	if err != nil {
		if _, perr := jointoken.Parse(nodeID); perr == nil {
			return a, refuse(KindInvalid, reasonSwapped)
		}
		return a, refuse(KindInvalid, err.Error())
	}
	a.Actor = "token:" + tok.ID
	if err := spiffeid.ValidNodeID(nodeID); err != nil {
		a.NodeID = ""
		return a, refuse(KindInvalid, "node_id: "+err.Error())
	}
	var pub crypto.PublicKey
	if len(csrData) > 0 {
		csr, err := ca.ParseCSR(csrData)
		if err != nil {
			return a, refuse(KindInvalid, "csr: "+err.Error())
		}
		pub = csr.PublicKey
	}
	// 2. The source's rate limit.
	if s.cfg.Limiter != nil && !s.cfg.Limiter.Allow(r.Source) {
		return a, refuse(KindRateLimited, "too many requests from this source")
	}
	var kid []byte
	if pub != nil {
		if kid, err = keyID(pub); err != nil {
			return a, err
		}
	}
	// 3. Token known and secret right, alike when either fails. The node
	// and the locks of step 7 come in the same read: one round trip.
	notFound := refuse(KindNotFound, "unknown join token or wrong secret")
	targets := store.Named([]store.LockTarget{{Kind: store.LockNode, Target: nodeID},
		{Kind: store.LockToken, Target: tok.ID}, keyLock(kid)})
	rd, err := s.cfg.Store.ReadJoin(ctx, tok.ID, nodeID, targets)
	if err != nil {
		return a, err
	}
	t := rd.Token
	if !rd.TokenFound {
		s.decoyCompare(tok)
		return a, notFound.with("no token %s", tok.ID)
	}
	if t.JoinMethod != store.JoinMethodToken {
		s.decoyCompare(tok)
		return a, notFound.with("token %s is a %s token", tok.ID, t.JoinMethod)
	}
	stored, err := s.openToken(t)
	if err != nil {
		return a, err
	}
	if !stored.SecretEqual(tok.Secret()) {
		return a, notFound.with("wrong secret for token %s", tok.ID)
	}

	now := s.cfg.Now()
	node, nodeExists := rd.Node, rd.NodeFound
	// A lost reply: the same token, node and key within the window gets
	// the certificate already issued, even if that use spent the token.
	if nodeExists && node.TokenID == t.ID && kid != nil {
		iss, err := s.retryJoin(ctx, node, t.ID, kid, now, store.LockTarget{Kind: store.LockToken, Target: t.ID})
		if err != nil {
			return a, err
		}
		if iss != nil {
			a.Retry = iss
			return a, nil
		}
	}
	// 4. Not expired or used up.
	switch err := (jointoken.Usage{ExpiresAt: t.ExpiresAt, UsesAllowed: t.UsesAllowed, UsesCount: t.UsesCount}).Check(now); err {
	case jointoken.ErrExpired:
		return a, refuse(KindFailedPrecondition, ReasonTokenExpired).with("token %s expired at %s; %s", t.ID, t.ExpiresAt.Format(time.RFC3339), newTokenWayOut(nodeID))
	case jointoken.ErrUsedUp:
		return a, refuse(KindFailedPrecondition, ReasonTokenUsedUp).with("token %s used %d of %d times; %s", t.ID, t.UsesCount, t.UsesAllowed, newTokenWayOut(nodeID))
	}
	// 5. Not bound to another node.
	if t.NodeID != "" && t.NodeID != nodeID {
		return a, refuse(KindPermissionDenied, ReasonTokenBoundElsewhere).with("token %s is bound to %s; join as %s, or with a token for %s: muster token create --node %s", t.ID, t.NodeID, t.NodeID, nodeID, nodeID)
	}
	// 6. Node ID free, or the token is bound to it.
	if nodeExists && t.NodeID != nodeID {
		return a, refuse(KindAlreadyExists, ReasonNodeTakenToken).with("token %s; %s", t.ID, nodeTakenWayOut(nodeID))
	}
	// 7. No lock on node, token or the key to certify (read with the
	// token).
	if l := lockOf(rd); l != nil {
		return a, s.lockedOn(ctx, targets, *l, "token %s, lock %s on %s %s", t.ID, l.ID, l.Kind, l.Target)
	}

	a.TokenID, a.Proof, a.Method = t.ID, "token "+t.ID, store.JoinMethodToken
	a.ServerAuth = t.SVIDUsage == store.SVIDUsageClientServer
	a.MaySupersede, a.PublicKey, a.KeyID, a.Now = t.NodeID == nodeID, pub, kid, now
	a.LockTargets, a.nodeFree = targets, !nodeExists
	return a, nil
}

// retryJoin answers a repeated join from the node's current instance, or
// returns nil if the request is not a retry. credential is the ID of the
// token or PSK the join proved; locks are the targets, besides the node
// and the instance, whose lock refuses the retry.
func (s *Service) retryJoin(ctx context.Context, node store.Node, credential string, kid []byte, now time.Time, locks ...store.LockTarget) (*Issued, error) {
	inst, err := s.cfg.Store.GetInstance(ctx, node.InstanceID)
	if err != nil {
		return nil, err
	}
	if inst.State != store.InstanceCurrent || inst.Generation != 0 || inst.TokenID != credential ||
		!hmac.Equal(inst.LastPublicKey, kid) || now.Sub(inst.CreatedAt) > s.cfg.RetryWindow {
		return nil, nil
	}
	targets := append([]store.LockTarget{{Kind: store.LockNode, Target: node.ID}, {Kind: store.LockInstance, Target: inst.ID}, keyLock(kid)}, locks...)
	if l, err := s.lockOn(ctx, targets...); err != nil {
		return nil, err
	} else if l != nil {
		return nil, s.lockedOn(ctx, targets, *l, "retry; lock %s on %s %s", l.ID, l.Kind, l.Target)
	}
	return s.issuedFrom(node.ID, inst, true)
}

// newTokenWayOut is the way out of a token that can admit no more joins,
// for the audit record of the refusal: a refused join consumed nothing.
func newTokenWayOut(node string) string {
	return "a new token: muster token create --node " + node
}

// nodeTakenWayOut is the way out of a join whose node exists: the same
// machine re-provisioned takes it with a token bound to it; a machine
// that is gone gives the node ID back.
func nodeTakenWayOut(node string) string {
	return fmt.Sprintf("re-provisioning node %s: muster token create --node %s, then on the machine muster agent join --force --data ADIR with the joining URI it prints; a machine that is gone: muster agents delete %s", node, node, node)
}
