package authority

import (
	"context"
	"crypto/x509"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// The admin API of the root rotation (rootrotate.go). Every step is
// audited: ca.root_rotate (target the new root's fingerprint) and
// ca.root_phase (target from→to), refusals with their reason.

func rootToProto(st RootStatus, from string) *musterv1.RootRotation {
	der := func(c *x509.Certificate) []byte {
		if c == nil {
			return nil
		}
		return c.Raw
	}
	r := &musterv1.RootRotation{Phase: st.Phase, Version: st.Version, OldRoot: der(st.Old), NewRoot: der(st.New),
		SigningRoot: der(st.Signing), HoldsOldKey: st.HoldsOldKey, PreviousPhase: from}
	for _, c := range st.Trusted {
		r.TrustedRoots = append(r.TrustedRoots, c.Raw)
	}
	for _, c := range st.Cross {
		r.CrossCertificates = append(r.CrossCertificates, c.Raw)
	}
	if !st.StartedAt.IsZero() {
		r.StartedAt = timestamppb.New(st.StartedAt)
	}
	if !st.ChangedAt.IsZero() {
		r.ChangedAt = timestamppb.New(st.ChangedAt)
	}
	return r
}

func (a *adminService) GetRootRotation(ctx context.Context, _ *musterv1.GetRootRotationRequest) (*musterv1.RootRotation, error) {
	st, err := a.s.rootStatus(ctx)
	if err != nil {
		err = toStatus(ctx, a.s.log, err)
		a.refused(ctx, "ca.root_status", "", err)
		return nil, err
	}
	return rootToProto(st, ""), nil
}

func (a *adminService) PrepareRoot(ctx context.Context, _ *musterv1.PrepareRootRequest) (*musterv1.PrepareRootResponse, error) {
	root, cur, sealed, exported, err := a.s.prepareRoot(ctx)
	if err != nil {
		err = toStatus(ctx, a.s.log, err)
		a.record(ctx, "ca.root_prepare", "", err)
		return nil, err
	}
	a.record(ctx, "ca.root_prepare", ca.Fingerprint(root), nil)
	return &musterv1.PrepareRootResponse{NewRoot: root.Raw, SealedKey: sealed, CurrentRoot: cur.Raw, CurrentRootExported: exported}, nil
}

func (a *adminService) RotateRoot(ctx context.Context, req *musterv1.RotateRootRequest) (*musterv1.RootRotation, error) {
	var prepared *preparedRoot
	if len(req.GetNewRoot()) > 0 || len(req.GetSealedKey()) > 0 || len(req.GetCrossNewByOld()) > 0 {
		prepared = &preparedRoot{cert: req.GetNewRoot(), sealedKey: req.GetSealedKey(), crossNewByOld: req.GetCrossNewByOld()}
	}
	st, err := a.s.rotateRoot(ctx, callerFrom(ctx).Actor(), prepared)
	if err != nil {
		err = toStatus(ctx, a.s.log, err)
		a.record(ctx, "ca.root_rotate", "", err)
		return nil, err
	}
	// Recorded by rotateRoot with the rotation's write.
	return rootToProto(st, ""), nil
}

func (a *adminService) NextRootPhase(ctx context.Context, req *musterv1.NextRootPhaseRequest) (*musterv1.RootRotation, error) {
	if err := a.knownPhase(ctx, req.GetFromPhase()); err != nil {
		return nil, err
	}
	if req.GetLeaveAway() {
		return a.rootStep(ctx, rootNextLeavingAway, req.GetFromPhase())
	}
	return a.rootStep(ctx, rootNext, req.GetFromPhase())
}

// knownPhase refuses a from_phase that is no phase: a typo is not a
// rotation that moved on, so it is INVALID_ARGUMENT, not ABORTED.
func (a *adminService) knownPhase(ctx context.Context, p string) error {
	if p == "" || p == store.RootPhaseNone || slices.Contains(rootPhases, p) {
		return nil
	}
	err := toStatus(ctx, a.s.log, badRequest(fmt.Sprintf("from_phase %q is not a phase (%s or %s); muster ca root status shows the one the rotation is in",
		p, store.RootPhaseNone, strings.Join(rootPhases, ", "))))
	a.record(ctx, "ca.root_phase", p+"->?", err)
	return err
}

func (a *adminService) RollbackRootPhase(ctx context.Context, req *musterv1.RollbackRootPhaseRequest) (*musterv1.RootRotation, error) {
	if err := a.knownPhase(ctx, req.GetFromPhase()); err != nil {
		return nil, err
	}
	if req.GetAbandonNow() {
		return a.rootStep(ctx, rootBackNow, req.GetFromPhase())
	}
	return a.rootStep(ctx, rootBack, req.GetFromPhase())
}

// rootStep takes step from the phase seen ("" for any).
func (a *adminService) rootStep(ctx context.Context, step rootStep, seen string) (*musterv1.RootRotation, error) {
	c := callerFrom(ctx)
	from, st, err := a.s.stepRootSeen(ctx, c.Actor(), step, seen, c.Cert)
	target := from + "->?"
	if err == nil {
		target = from + "->" + st.Phase
	}
	if err != nil {
		err = toStatus(ctx, a.s.log, err)
		a.record(ctx, "ca.root_phase", target, err)
		return nil, err
	}
	// Recorded by stepRoot with the phase's write.
	return rootToProto(st, from), nil
}
