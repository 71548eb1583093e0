package enroll

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/store"
)

// admit issues the first certificate of a new instance and commits the
// join. The certificate is signed before the write so the store's write
// lock is never held across a signature; if the write fails, the
// certificate is simply never handed out.
func (s *Service) admit(ctx context.Context, a Admission, ev *audit.Event) (*Issued, error) {
	var keystore func(ca.Signed) ([]byte, string, error)
	if a.PublicKey == nil {
		key, finish, err := s.keystore()
		if err != nil {
			return nil, err
		}
		a.PublicKey, keystore = key.Public(), finish
		if a.KeyID, err = keyID(a.PublicKey); err != nil {
			return nil, err
		}
	}
	leaf, chain, err := s.issue(a.NodeID, a.Method, a.PublicKey, a.Now, a.ServerAuth)
	if err != nil {
		return nil, err
	}
	recorded := a.TokenID
	if a.Credential != "" {
		recorded = a.Credential
	}
	inst := store.Instance{
		ID:            uuid.NewString(),
		JoinMethod:    a.Method,
		TokenID:       recorded,
		CreatedAt:     a.Now,
		LastSerial:    leaf.SerialNumber.Text(16),
		LastPublicKey: a.KeyID,
		LastChainPEM:  chain,
		LastIssuedAt:  a.Now,
	}
	// The record of the join is written with the join: both or neither.
	ev.Result = audit.ResultOK
	// Concatenated, not formatted: every join builds this reason.
	ev.Reason = "method " + a.Method + ", " + a.Proof + ", instance " + inst.ID + ", serial " + inst.LastSerial
	if a.MaySupersede {
		ev.Reason += ", superseding the node's current instance if any"
	}
	build, err := s.cfg.Audit.Builder(*ev)
	if err != nil {
		return nil, err
	}
	res, err := s.cfg.Store.CommitJoin(ctx, store.Join{
		Audit:          build.Build,
		TokenID:        a.TokenID,
		Credential:     a.Credential,
		NodeID:         a.NodeID,
		MaySupersede:   a.MaySupersede,
		NodeFreeAtRead: a.nodeFree,
		RetryWindow:    s.cfg.RetryWindow,
		Ticket:         a.Ticket,
		Claims:         a.Claims,
		LockTargets:    a.LockTargets,
		Instance:       inst,
		Certificate: store.Certificate{
			Serial:     inst.LastSerial,
			NodeID:     a.NodeID,
			InstanceID: inst.ID,
			JoinMethod: a.Method,
			TokenID:    recorded,
			PublicKey:  a.KeyID,
			NotBefore:  leaf.NotBefore,
			NotAfter:   leaf.NotAfter,
			IssuedAt:   a.Now,
		},
	})
	switch {
	case errors.Is(err, store.ErrTokenSpent):
		return nil, refuse(KindFailedPrecondition, ReasonTokenSpent).with("token %s, at the write; %s", a.TokenID, newTokenWayOut(a.NodeID))
	case errors.Is(err, store.ErrTicketReplayed):
		s.observeTicket(TicketResultReplayed)
		return nil, refuse(KindPermissionDenied, ReasonTicketUsed).with("%s, at the write", a.Proof)
	case errors.Is(err, store.ErrNodeTaken) && a.TokenID == "":
		return nil, refuse(KindAlreadyExists, ReasonNodeTaken).with("%s, at the write; %s", a.Proof, nodeTakenWayOut(a.NodeID))
	case errors.Is(err, store.ErrNodeTaken):
		return nil, refuse(KindAlreadyExists, ReasonNodeTakenToken).with("token %s, at the write; %s", a.TokenID, nodeTakenWayOut(a.NodeID))
	case errors.Is(err, store.ErrRegistrationClosed):
		return nil, refuse(KindFailedPrecondition, ReasonRegistrationClosed).with("%s, at the write: %v; %s", a.Proof, err, newSecretWayOut(a.TokenID, a.NodeID, a.botAddFlags))
	case errors.Is(err, store.ErrKeyBindingChanged):
		// Another join bound or rotated the key between the read and
		// the write: the agent's next attempt is judged against it.
		return nil, refuse(KindFailedPrecondition, ReasonRegistrationClosed).with("%s, at the write: %v", a.Proof, err)
	case errors.Is(err, store.ErrRecoveryExhausted):
		return nil, refuse(KindFailedPrecondition, ReasonRecoveryExhausted).with("%s, at the write; %s", a.Proof, raiseLimitWayOut(a.TokenID))
	case errors.Is(err, store.ErrRecoverySequenceChanged):
		// Another recovery from the same join state committed first. This
		// one is refused but locks nothing: it presented the state that
		// was current when it was judged.
		return nil, refuse(KindPermissionDenied, ReasonJoinStateMismatch).with("%s: another recovery committed first", a.Proof)
	case errors.Is(err, store.ErrResyncClosed):
		return nil, refuse(KindPermissionDenied, ReasonJoinStateMismatch).with("%s: the resync window closed before the write; %s", a.Proof, boundkeypair.ResyncHint)
	case errors.Is(err, store.ErrNotFound):
		return nil, refuse(KindNotFound, "unknown join token or wrong secret").with("token %s deleted during the join", a.TokenID)
	case err != nil:
		return nil, err
	}
	if res.Retry {
		ev.Reason = retryReason(res.Instance.ID, res.Instance.LastSerial)
		return s.issuedFrom(a.NodeID, res.Instance, true)
	}
	s.cfg.Audit.Appended(build)
	iss := &Issued{NodeID: a.NodeID, ChainPEM: chain, CAPEM: s.rootsPEM(), InstanceID: inst.ID, NotAfter: leaf.NotAfter, audited: true}
	if keystore != nil {
		if iss.PKCS12, iss.PKCS12Password, err = keystore(leaf); err != nil {
			return nil, err
		}
	}
	return iss, nil
}

// issuedFrom answers from the last certificate an instance holds.
func (s *Service) issuedFrom(nodeID string, inst store.Instance, retry bool) (*Issued, error) {
	certs, err := ca.ParseCertsPEM(inst.LastChainPEM)
	if err != nil {
		return nil, fmt.Errorf("enroll: instance %s: stored chain: %w", inst.ID, err)
	}
	return &Issued{NodeID: nodeID, ChainPEM: inst.LastChainPEM, CAPEM: s.rootsPEM(), InstanceID: inst.ID,
		Generation: inst.Generation, NotAfter: certs[0].NotAfter, Retry: retry, serial: inst.LastSerial}, nil
}

// retryReason is the audit reason of a repeated join answered with the
// certificate already issued to it, whether the repeat was seen at the
// read (retryJoin) or at the write.
func retryReason(instanceID, serial string) string {
	return "retry answered with instance " + instanceID + ", serial " + serial
}

func serialOf(c *x509.Certificate) string { return c.SerialNumber.Text(16) }
