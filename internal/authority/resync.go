package authority

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// maxResyncWindow bounds a resync window: it exists for the agents that
// come back after a restore, and a forgotten one would stay a standing
// exception.
const maxResyncWindow = 7 * 24 * time.Hour

// OpenResync opens a bound-keypair resync window: the next authority epoch
// begins, and until the window closes a join state ahead of the restored
// store is accepted once per token. Audited as bound_keypair.resync.open,
// in the transaction that opens it; a refusal after.
func (a *adminService) OpenResync(ctx context.Context, req *musterv1.OpenResyncRequest) (*musterv1.ResyncWindowResponse, error) {
	resp, err := a.openResync(ctx, req)
	if err != nil {
		err = toStatus(ctx, a.s.log, err)
		a.record(ctx, "bound_keypair.resync.open", "window", err)
		return nil, err
	}
	return resp, nil
}

func (a *adminService) openResync(ctx context.Context, req *musterv1.OpenResyncRequest) (*musterv1.ResyncWindowResponse, error) {
	d := req.GetDuration().AsDuration()
	switch {
	case req.GetDuration() == nil || d <= 0 || d > maxResyncWindow:
		return nil, badRequest("resync window duration must be more than 0 and at most 168h (7 days)")
	case req.GetReason() == "":
		return nil, badRequest("resync window reason is required (it is audited): say which backup was restored")
	case len(req.GetReason()) > maxLockReason:
		return nil, badRequest(fmt.Sprintf("resync window reason must be at most %d characters", maxLockReason))
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	id := "ep-" + hex.EncodeToString(b[:])
	// The window opens with its record, or not at all: the record names
	// the epoch and its end as the store wrote them.
	audited := a.epochLink(ctx, "bound_keypair.resync.open", func(e store.ResyncEpoch) string {
		return fmt.Sprintf("epoch %s until %s: %s", e.ID, e.Until.UTC().Format(time.RFC3339), e.Reason)
	})
	e, err := a.s.store.OpenResync(ctx, store.ResyncOpen{ID: id, For: d, OpenedBy: callerFrom(ctx).Actor(), Reason: req.GetReason()}, audited.build)
	if errors.Is(err, store.ErrConflict) {
		return nil, refused(codes.FailedPrecondition, "a resync window is open: close it first (muster bound-keypair resync close) or wait for it to end")
	}
	if err != nil {
		return nil, fmt.Errorf("resync window %s not opened: it opens with its bound_keypair.resync.open record or not at all, and the write failed: %w", id, err)
	}
	audited.appended()
	a.s.log.Warn("bound-keypair resync window opened: join states ahead of the store are accepted once per token",
		"epoch", e.ID, "until", e.Until, "by", e.OpenedBy)
	return &musterv1.ResyncWindowResponse{Window: a.resyncToProto(ctx, e)}, nil
}

// CloseResync closes the open window early. Audited as
// bound_keypair.resync.close, in the transaction that closes it; a
// refusal after.
func (a *adminService) CloseResync(ctx context.Context, req *musterv1.CloseResyncRequest) (*musterv1.ResyncWindowResponse, error) {
	resp, err := a.closeResync(ctx, req)
	if err != nil {
		err = toStatus(ctx, a.s.log, err)
		a.record(ctx, "bound_keypair.resync.close", "window", err)
		return nil, err
	}
	return resp, nil
}

func (a *adminService) closeResync(ctx context.Context, req *musterv1.CloseResyncRequest) (*musterv1.ResyncWindowResponse, error) {
	if len(req.GetReason()) > maxLockReason {
		return nil, badRequest(fmt.Sprintf("reason must be at most %d characters", maxLockReason))
	}
	audited := a.epochLink(ctx, "bound_keypair.resync.close", func(e store.ResyncEpoch) string {
		if req.GetReason() != "" {
			return "epoch " + e.ID + ": " + req.GetReason()
		}
		return "epoch " + e.ID
	})
	e, err := a.s.store.CloseResync(ctx, callerFrom(ctx).Actor(), audited.build)
	if errors.Is(err, store.ErrNotFound) {
		return nil, refused(codes.FailedPrecondition, "no resync window is open")
	}
	if err != nil {
		return nil, fmt.Errorf("resync window not closed: it closes with its bound_keypair.resync.close record or not at all, and the write failed: %w", err)
	}
	audited.appended()
	return &musterv1.ResyncWindowResponse{Window: a.resyncToProto(ctx, e)}, nil
}

// epochRecord is the record of a resync window's write, built for the
// epoch the store wrote (its target names it).
type epochRecord struct {
	s    *Server
	e    audit.Event
	name func(store.ResyncEpoch) string
	link *audit.Link
}

// epochLink is the record of the caller's action on a window whose target
// name gives.
func (a *adminService) epochLink(ctx context.Context, action string, name func(store.ResyncEpoch) string) *epochRecord {
	c := callerFrom(ctx)
	return &epochRecord{s: a.s, name: name, e: audit.Event{Actor: c.Actor(), Action: action, Result: audit.ResultOK,
		Source: c.Source, CorrelationID: c.CorrelationID}}
}

// build is the store's audit argument: the record for e.
func (r *epochRecord) build(e store.ResyncEpoch) func(store.AuditHead) (store.AuditRecord, error) {
	ev := r.e
	ev.Target = r.name(e)
	link, err := r.s.audit.Builder(ev)
	if err != nil {
		return func(store.AuditHead) (store.AuditRecord, error) { return store.AuditRecord{}, err }
	}
	r.link = link
	return link.Build
}

// appended notes the record once the write committed.
func (r *epochRecord) appended() {
	if r.link != nil {
		r.s.audit.Appended(r.link)
	}
}

// ListResync lists every window, oldest first.
func (a *adminService) ListResync(ctx context.Context, _ *musterv1.ListResyncRequest) (*musterv1.ListResyncResponse, error) {
	list, err := a.s.store.ListResyncEpochs(ctx)
	if err != nil {
		return nil, toStatus(ctx, a.s.log, err)
	}
	resp := &musterv1.ListResyncResponse{}
	for _, e := range list {
		resp.Windows = append(resp.Windows, a.resyncToProto(ctx, e))
	}
	return resp, nil
}

// resyncToProto says whether the window is open by the store clock (the
// one the join's write checks); the authority's clock if it cannot tell.
func (a *adminService) resyncToProto(ctx context.Context, e store.ResyncEpoch) *musterv1.ResyncWindow {
	now, err := a.s.store.Now(ctx)
	if err != nil {
		now = time.Now()
	}
	w := &musterv1.ResyncWindow{Epoch: e.ID, Ordinal: e.Ordinal, OpenedAt: timestamppb.New(e.OpenedAt),
		Until: timestamppb.New(e.Until), OpenedBy: e.OpenedBy, ClosedBy: e.ClosedBy, Reason: e.Reason, Open: e.OpenAt(now)}
	if !e.ClosedAt.IsZero() {
		w.ClosedAt = timestamppb.New(e.ClosedAt)
	}
	return w
}
