package enroll

import (
	"context"
	"fmt"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/store"
)

// epochs reads the authority epochs the resync windows began, for judging
// a join state at now.
func (s *Service) epochs(ctx context.Context, now time.Time) (boundkeypair.Epochs, error) {
	list, err := s.cfg.Store.ListResyncEpochs(ctx)
	if err != nil {
		return boundkeypair.Epochs{}, err
	}
	ep := boundkeypair.Epochs{Ordinal: make(map[string]int64, len(list))}
	for _, e := range list {
		ep.Ordinal[e.ID] = e.Ordinal
		ep.Current, ep.WindowOpen = e.ID, e.OpenAt(now)
	}
	return ep, nil
}

// auditResync records a committed resync (token.resync): what the token was
// brought forward from and to, so an operator can review every token a
// window let through.
func (s *Service) auditResync(ctx context.Context, out *bkOutcome, nodeID string) error {
	v := out.resync
	reason := fmt.Sprintf("node %s: join state ahead of the restored store accepted in resync epoch %q: sequence %d (epoch %q) brought forward to %d",
		nodeID, v.Epoch, v.ExpectedSequence, v.ExpectedEpoch, v.Sequence)
	if out.rebound {
		reason += fmt.Sprintf("; bound key rebound from %s to %s, the key the join state names", fingerprintOr(out.proved), out.key.Fingerprint())
	}
	return s.cfg.Audit.Record(ctx, audit.Event{Actor: "authority", Action: "token.resync", Target: "token " + out.token.ID,
		Result: audit.ResultOK, Reason: reason})
}

// rebindable returns the verified join state p presents if its key (the
// one it names, offered in init) is to be challenged instead of the
// token's (boundkeypair.MayRebind), with the epochs it read; nil if the
// join goes on as without a window, and then, inside a window, why not
// (for the audit record of the refusal that follows). Only a join offering
// a key other than the token's costs the epochs' read and the document's
// verification.
func (s *Service) rebindable(ctx context.Context, t store.Token, p BoundKeypairPayload, offered boundkeypair.PublicKey, now time.Time) (*boundkeypair.JoinState, boundkeypair.Epochs, string, error) {
	bk := t.BoundKeypair
	if offered.IsZero() || p.JoinState == "" || p.RegistrationSecret != "" || offered.String() == bk.BoundPublicKey {
		return nil, boundkeypair.Epochs{}, "", nil
	}
	ep, err := s.epochs(ctx, now)
	if err != nil {
		return nil, ep, "", err
	}
	js, err := boundkeypair.VerifyJoinState(p.JoinState, s.joinStateKeys().lookup(ctx), s.cfg.AuthorityID, t.ID, p.NodeID)
	if err != nil {
		if !ep.WindowOpen {
			return nil, ep, "", nil
		}
		// Judged as without a window: the token's key is challenged.
		return nil, ep, fmt.Sprintf("no rebind to the offered key: %v", err), nil
	}
	b := boundkeypair.Binding{LastRotatedAt: bk.LastRotatedAt, CreatedAt: t.CreatedAt}
	if bk.BoundPublicKey != "" {
		cur, err := boundkeypair.ParsePublicKey(bk.BoundPublicKey)
		if err != nil {
			return nil, ep, "", fmt.Errorf("enroll: token %s: stored key: %w", t.ID, err)
		}
		b.Key = cur.Fingerprint()
	}
	if !ep.WindowOpen {
		// Nothing is rebound outside a window. But a join that a window
		// would rebind is what an agent refused after a restore looks
		// like, so its refusal says what the operator can do about it.
		open := ep
		open.WindowOpen = true
		if boundkeypair.MayRebind(b, &js, offered.Fingerprint(), open) == nil {
			return nil, ep, restoreHint, nil
		}
		return nil, ep, "", nil
	}
	if err := boundkeypair.MayRebind(b, &js, offered.Fingerprint(), ep); err != nil {
		return nil, ep, err.Error(), nil
	}
	return &js, ep, "", nil
}

// restoreHint is the refusal detail of a join a resync window would
// rebind: the agent's verified join state names its key, issued after the
// token's last rotation — the mark of a store restored from before it.
const restoreHint = "the agent's join state names the key it offered, signed after the token's last rotation, " +
	"so a resync window would rebind it: " + boundkeypair.ResyncHint

// fingerprintOr names a key for an audit record: its fingerprint, or
// "none" for the zero key.
func fingerprintOr(k boundkeypair.PublicKey) string {
	if k.IsZero() {
		return "none"
	}
	return k.Fingerprint()
}
