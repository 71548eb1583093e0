package enroll

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/store"
)

// admission is a join whose proof has been verified: what every join method
// hands to the common tail.
type admission struct {
	nodeID string
	// tokenID is the token whose use this is; credential, for a method
	// without a token, the ID of what proved the join (a PSK's). Either
	// is recorded as the instance's TokenID.
	tokenID    string
	credential string
	// proof names the proof in the audit record ("token ID", "psk ID
	// (active)"), never a secret.
	proof        string
	method       string
	maySupersede bool
	// pub is the CSR's key; nil asks the authority to mint one.
	pub   crypto.PublicKey
	keyID []byte
	now   time.Time
	// ticket is the referral ticket whose single use the join records.
	ticket *store.TicketUse
}

// admit issues the first certificate of a new instance and commits the
// join. The certificate is signed before the write so the store's write
// lock is never held across a signature; if the write fails, the
// certificate is simply never handed out.
func (s *Service) admit(ctx context.Context, a admission, ev *audit.Event) (*Issued, error) {
	var keystore func(leaf *x509.Certificate) ([]byte, string, error)
	if a.pub == nil {
		key, finish, err := s.keystore()
		if err != nil {
			return nil, err
		}
		a.pub, keystore = key.Public(), finish
		if a.keyID, err = keyID(a.pub); err != nil {
			return nil, err
		}
	}
	leaf, chain, err := s.issue(a.nodeID, a.pub, a.now)
	if err != nil {
		return nil, err
	}
	recorded := a.tokenID
	if a.credential != "" {
		recorded = a.credential
	}
	inst := store.Instance{
		ID:            uuid.NewString(),
		JoinMethod:    a.method,
		TokenID:       recorded,
		CreatedAt:     a.now,
		LastSerial:    serialOf(leaf),
		LastPublicKey: a.keyID,
		LastChainPEM:  chain,
		LastIssuedAt:  a.now,
	}
	// The record of the join is written with the join: both or neither.
	ev.Result = audit.ResultOK
	ev.Reason = fmt.Sprintf("method %s, %s, instance %s, serial %s", a.method, a.proof, inst.ID, inst.LastSerial)
	if a.maySupersede {
		ev.Reason += ", superseding the node's current instance if any"
	}
	build, err := s.cfg.Audit.Builder(*ev)
	if err != nil {
		return nil, err
	}
	res, err := s.cfg.Store.CommitJoin(ctx, store.Join{
		Audit:        build,
		TokenID:      a.tokenID,
		Credential:   a.credential,
		NodeID:       a.nodeID,
		MaySupersede: a.maySupersede,
		RetryWindow:  s.cfg.RetryWindow,
		Ticket:       a.ticket,
		Instance:     inst,
		Certificate: store.Certificate{
			Serial:     inst.LastSerial,
			NodeID:     a.nodeID,
			InstanceID: inst.ID,
			JoinMethod: a.method,
			TokenID:    recorded,
			PublicKey:  a.keyID,
			NotBefore:  leaf.NotBefore,
			NotAfter:   leaf.NotAfter,
			IssuedAt:   a.now,
		},
	})
	switch {
	case errors.Is(err, store.ErrTokenSpent):
		return nil, refuse(KindFailedPrecondition, "join token has no uses left or expired").with("token %s, at the write", a.tokenID)
	case errors.Is(err, store.ErrTicketReplayed):
		s.observeTicket(TicketResultReplayed)
		return nil, refuse(KindPermissionDenied, ReasonTicketUsed).with("%s, at the write", a.proof)
	case errors.Is(err, store.ErrNodeTaken) && a.tokenID == "":
		return nil, refuse(KindAlreadyExists, reasonNodeTaken).with("%s, at the write", a.proof)
	case errors.Is(err, store.ErrNodeTaken):
		return nil, refuse(KindAlreadyExists, "node ID already exists; delete the node or use a token bound to it with --node").with("token %s, at the write", a.tokenID)
	case errors.Is(err, store.ErrNotFound):
		return nil, refuse(KindNotFound, "unknown join token or wrong secret").with("token %s deleted during the join", a.tokenID)
	case err != nil:
		return nil, err
	}
	if res.Retry {
		ev.Reason = fmt.Sprintf("retry answered with instance %s, serial %s", res.Instance.ID, res.Instance.LastSerial)
		return s.issuedFrom(a.nodeID, res.Instance, true)
	}
	s.cfg.Audit.Appended(*ev)
	iss := &Issued{NodeID: a.nodeID, ChainPEM: chain, CAPEM: s.rootPM, InstanceID: inst.ID, NotAfter: leaf.NotAfter, audited: true}
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
	return &Issued{NodeID: nodeID, ChainPEM: inst.LastChainPEM, CAPEM: s.rootPM, InstanceID: inst.ID,
		Generation: inst.Generation, NotAfter: certs[0].NotAfter, Retry: retry}, nil
}

func serialOf(c *x509.Certificate) string { return c.SerialNumber.Text(16) }
