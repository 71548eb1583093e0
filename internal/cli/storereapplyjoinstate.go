package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/muster-dev/muster/internal/store"
)

// joinStatePlan is what reapply does with one bound-keypair token's join
// state: carry it (carry set), nothing (in place: both nil and ""), or
// leave it, saying why (why set).
type joinStatePlan struct {
	carry *store.CarriedJoinState
	why   string
}

// joinState plans the join state of bound-keypair token id: the store
// kept aside's carried where the restored store holds the same token
// (its creation) behind it, so its agent refreshes with the key it holds
// now, and a key it rotated away since binds no more. Not carried: a
// token gone from either store or made anew since (planTokens deletes
// it), and a join state of an epoch the restored store does not know (a
// resync window opened since the backup), which only a window brings
// forward. The plans are read once per token.
func (p *reapplyPlanner) joinState(ctx context.Context, id string) (joinStatePlan, error) {
	if js, ok := p.joinStates[id]; ok {
		return js, nil
	}
	js, err := p.readJoinState(ctx, id)
	if err != nil {
		return js, err
	}
	if p.joinStates == nil {
		p.joinStates = map[string]joinStatePlan{}
	}
	p.joinStates[id] = js
	return js, nil
}

func (p *reapplyPlanner) readJoinState(ctx context.Context, id string) (joinStatePlan, error) {
	had, err := p.from.GetToken(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return joinStatePlan{why: "the store kept aside holds no token " + id}, nil
	}
	if err != nil {
		return joinStatePlan{}, fmt.Errorf("reading the tokens of the store kept aside: %w", err)
	}
	held, err := p.st.GetToken(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return joinStatePlan{why: "the restored store holds no token " + id + " (made since the backup)"}, nil
	}
	if err != nil {
		return joinStatePlan{}, err
	}
	switch {
	case had.BoundKeypair == nil || held.BoundKeypair == nil:
		return joinStatePlan{why: "token " + id + " is no bound-keypair token in both stores"}, nil
	case !had.CreatedAt.Equal(held.CreatedAt):
		return joinStatePlan{why: "the restored store holds another token " + id + " (the store kept aside's was made anew since)"}, nil
	}
	h, f := *held.BoundKeypair, *had.BoundKeypair
	if h.BoundPublicKey == f.BoundPublicKey && h.BoundInstanceID == f.BoundInstanceID && h.RecoverySequence == f.RecoverySequence &&
		h.RecoveryCount == f.RecoveryCount && h.Epoch == f.Epoch && h.LastRotatedAt.Equal(f.LastRotatedAt) &&
		(len(h.SecretCiphertext) == 0) == (len(f.SecretCiphertext) == 0) {
		return joinStatePlan{}, nil
	}
	if f.Epoch != "" {
		known, err := p.epochOrdinals(ctx)
		if err != nil {
			return joinStatePlan{}, err
		}
		if _, ok := known[f.Epoch]; !ok {
			return joinStatePlan{why: fmt.Sprintf("its token entered epoch %s since the backup, a resync window the restored store does not know", f.Epoch)}, nil
		}
		if f.Epoch != h.Epoch && known[f.Epoch] < known[h.Epoch] {
			return joinStatePlan{why: fmt.Sprintf("the restored store holds its token in epoch %s, after the store kept aside's %s", h.Epoch, f.Epoch)}, nil
		}
	}
	c := store.CarriedJoinState{TokenID: id, Held: h, State: f}
	if err := c.Check(); err != nil {
		return joinStatePlan{why: "the restored store holds its join state ahead of the store kept aside's: " + err.Error()}, nil
	}
	return joinStatePlan{carry: &c}, nil
}

// epochOrdinals are the resync epochs the restored store knows, by ID.
func (p *reapplyPlanner) epochOrdinals(ctx context.Context) (map[string]int64, error) {
	if p.epochs != nil {
		return p.epochs, nil
	}
	eps, err := p.st.ListResyncEpochs(ctx)
	if err != nil {
		return nil, err
	}
	p.epochs = map[string]int64{"": 0}
	for _, e := range eps {
		p.epochs[e.ID] = e.Ordinal
	}
	return p.epochs, nil
}

// planJoinStates carries forward the bound-keypair join state the store
// kept aside holds ahead of the restored store, after the identities
// carried (planCerts): first the join-state keys made since the backup,
// so the documents its agents hold verify, then each token's bound key,
// recovery sequence and count, epoch and bound instance, one write per
// token. Its agent then refreshes with the key it holds now, with no
// resync window, and a key it rotated away since is refused again.
func (p *reapplyPlanner) planJoinStates(ctx context.Context, res *reapplyResult) error {
	have, err := p.st.ListJoinStateKeys(ctx)
	if err != nil {
		return err
	}
	had, err := p.from.ListJoinStateKeys(ctx)
	if err != nil {
		return fmt.Errorf("reading the join-state keys of the store kept aside: %w", err)
	}
	var keys []store.JoinStateKey
	var ids []string
	for _, k := range had {
		if !slices.ContainsFunc(have, func(h store.JoinStateKey) bool { return h.ID == k.ID }) {
			keys = append(keys, k)
			ids = append(ids, k.ID)
		}
	}
	if len(keys) > 0 {
		c := store.CarriedJoinState{Keys: keys}
		res.Steps = append(res.Steps, reapplyStep{Action: "join_state.key",
			What:   "carry join-state key(s) " + strings.Join(ids, ", ") + " made since the backup (the join state documents they signed verify)",
			target: "join-state keys",
			write: func(ctx context.Context, st store.Store, build func(store.AuditHead) (store.AuditRecord, error)) error {
				return st.CarryJoinState(ctx, c, build)
			}})
	}
	tokens, err := p.from.ListTokens(ctx)
	if err != nil {
		return fmt.Errorf("reading the tokens of the store kept aside: %w", err)
	}
	for _, t := range tokens {
		if t.BoundKeypair == nil {
			continue
		}
		js, err := p.joinState(ctx, t.ID)
		if err != nil {
			return err
		}
		if js.carry == nil {
			continue
		}
		c := *js.carry
		h, f := c.Held, c.State
		what := fmt.Sprintf("join state of token %s: bound key %s, recovery sequence %d (%d counted), epoch %q", t.ID,
			cmpOr(f.BoundPublicKey, "none"), f.RecoverySequence, f.RecoveryCount, f.Epoch)
		what += fmt.Sprintf(" (the restored store holds %s, %d (%d), %q)", cmpOr(h.BoundPublicKey, "none"), h.RecoverySequence, h.RecoveryCount, h.Epoch)
		if h.BoundPublicKey != "" && h.BoundPublicKey != f.BoundPublicKey {
			what += "; the key rotated away, " + h.BoundPublicKey + ", binds no more"
		}
		match := func(r store.AuditRecord) bool {
			return strings.Contains(r.Reason, "token "+t.ID+",") || strings.Contains(r.Reason, "token "+t.ID+" ")
		}
		r, _ := p.last("agent.join", match)
		if f, ok := p.last("agent.refresh", match); ok && f.Seq > r.Seq {
			r = f
		}
		res.Steps = append(res.Steps, reapplyStep{Seq: r.Seq, Action: cmpOr(r.Action, "agent.refresh"), What: "carry " + what, target: "token " + t.ID,
			write: func(ctx context.Context, st store.Store, build func(store.AuditHead) (store.AuditRecord, error)) error {
				return st.CarryJoinState(ctx, c, build)
			}})
	}
	return nil
}
