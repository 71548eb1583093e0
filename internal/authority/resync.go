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

	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// maxResyncWindow bounds a resync window: it exists for the agents that
// come back after a restore, and a forgotten one would stay a standing
// exception.
const maxResyncWindow = 7 * 24 * time.Hour

// OpenResync opens a bound-keypair resync window: the next authority epoch
// begins, and until the window closes a join state ahead of the restored
// store is accepted once per token. Audited as bound_keypair.resync.open.
func (a *adminService) OpenResync(ctx context.Context, req *musterv1.OpenResyncRequest) (*musterv1.ResyncWindowResponse, error) {
	resp, err := a.openResync(ctx, req)
	err = toStatus(ctx, a.s.log, err)
	target := "window"
	if resp != nil {
		w := resp.GetWindow()
		target = fmt.Sprintf("epoch %s until %s: %s", w.GetEpoch(), w.GetUntil().AsTime().UTC().Format(time.RFC3339), w.GetReason())
	}
	a.record(ctx, "bound_keypair.resync.open", target, err)
	return resp, err
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
	e, err := a.s.store.OpenResync(ctx, store.ResyncOpen{ID: "ep-" + hex.EncodeToString(b[:]), For: d,
		OpenedBy: callerFrom(ctx).Actor(), Reason: req.GetReason()})
	if errors.Is(err, store.ErrConflict) {
		return nil, refused(codes.FailedPrecondition, "a resync window is open: close it first (muster bound-keypair resync close) or wait for it to end")
	}
	if err != nil {
		return nil, err
	}
	a.s.log.Warn("bound-keypair resync window opened: join states ahead of the store are accepted once per token",
		"epoch", e.ID, "until", e.Until, "by", e.OpenedBy)
	return &musterv1.ResyncWindowResponse{Window: a.resyncToProto(ctx, e)}, nil
}

// CloseResync closes the open window early. Audited as
// bound_keypair.resync.close.
func (a *adminService) CloseResync(ctx context.Context, req *musterv1.CloseResyncRequest) (*musterv1.ResyncWindowResponse, error) {
	var resp *musterv1.ResyncWindowResponse
	var err error
	if len(req.GetReason()) > maxLockReason {
		err = badRequest(fmt.Sprintf("reason must be at most %d characters", maxLockReason))
	} else {
		var e store.ResyncEpoch
		e, err = a.s.store.CloseResync(ctx, callerFrom(ctx).Actor())
		if errors.Is(err, store.ErrNotFound) {
			err = refused(codes.FailedPrecondition, "no resync window is open")
		} else if err == nil {
			resp = &musterv1.ResyncWindowResponse{Window: a.resyncToProto(ctx, e)}
		}
	}
	err = toStatus(ctx, a.s.log, err)
	target := "window"
	if resp != nil {
		target = "epoch " + resp.GetWindow().GetEpoch()
		if req.GetReason() != "" {
			target += ": " + req.GetReason()
		}
	}
	a.record(ctx, "bound_keypair.resync.close", target, err)
	return resp, err
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
