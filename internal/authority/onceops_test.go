package authority

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestNextRootPhaseIsTakenFromThePhaseSeen: two next-phase calls asked on
// the phase one status showed (two operators, or a retry through another
// replica) advance one phase, not two: the second is refused ABORTED,
// naming the phase and the way out, and changes nothing. An older client
// that names no phase moves on from wherever the rotation is.
func TestNextRootPhaseIsTakenFromThePhaseSeen(t *testing.T) {
	b := startReplicas(t, nil, 1)
	a := &adminService{s: b.srvs[0]}
	ctx := t.Context()
	if _, err := b.srvs[0].rotateRoot(ctx, "t", nil); err != nil {
		t.Fatal(err)
	}
	seen := &musterv1.NextRootPhaseRequest{FromPhase: store.RootPhaseInit}
	if st, err := a.NextRootPhase(ctx, seen); err != nil || st.GetPhase() != store.RootPhaseUpdateAgents {
		t.Fatalf("first next-phase = %v, %v; want update_agents", st.GetPhase(), err)
	}
	_, err := a.NextRootPhase(ctx, seen)
	if status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "muster ca root status") ||
		!strings.Contains(err.Error(), store.RootPhaseUpdateAgents) {
		t.Fatalf("second next-phase from init = %v; want ABORTED naming update_agents and muster ca root status", err)
	}
	row, err := b.store.GetRootRotation(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if row.Phase != store.RootPhaseUpdateAgents {
		t.Fatalf("phase %s after a refused next-phase, want update_agents", row.Phase)
	}
	// A phase that is none is a typo, not a rotation that moved on.
	if _, err := a.NextRootPhase(ctx, &musterv1.NextRootPhaseRequest{FromPhase: "update-agents"}); status.Code(err) != codes.InvalidArgument ||
		!strings.Contains(err.Error(), "muster ca root status") {
		t.Fatalf("next-phase from update-agents = %v; want INVALID_ARGUMENT naming muster ca root status", err)
	}
	// A step that lost its write to another step is ABORTED as well:
	// the operator looks again, whichever way the two calls raced.
	if err := toStatus(ctx, b.srvs[0].log, errRootChanged); status.Code(err) != codes.Aborted {
		t.Fatalf("a lost root step = %v; want ABORTED", err)
	}
	// Two rollbacks from update_agents go back one phase: the second,
	// taken from init, would abandon the new root.
	back := &musterv1.RollbackRootPhaseRequest{FromPhase: store.RootPhaseUpdateAgents}
	if st, err := a.RollbackRootPhase(ctx, back); err != nil || st.GetPhase() != store.RootPhaseInit {
		t.Fatalf("first rollback = %v, %v; want init", st.GetPhase(), err)
	}
	if _, err := a.RollbackRootPhase(ctx, back); status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "muster ca root rollback") {
		t.Fatalf("second rollback from update_agents = %v; want ABORTED naming muster ca root rollback", err)
	}
	if row, err := b.store.GetRootRotation(ctx); err != nil || row.Phase != store.RootPhaseInit {
		t.Fatalf("phase %s, %v after a refused rollback, want init", row.Phase, err)
	}
	// Without a phase (an older CLI), the step is taken as before.
	if st, err := a.NextRootPhase(ctx, &musterv1.NextRootPhaseRequest{}); err != nil || st.GetPhase() != store.RootPhaseUpdateAgents {
		t.Fatalf("next-phase naming no phase = %v, %v; want update_agents", st.GetPhase(), err)
	}
}

// TestRotatePSKFromAReplacedKeyIsRefused: two rotations asked on the PSK
// one listing showed cannot both succeed. With --grace 0s the second
// would revoke the first's new PSK at once; it is refused ABORTED,
// naming the way out, and the first's PSK stays active.
func TestRotatePSKFromAReplacedKeyIsRefused(t *testing.T) {
	b := startReplicas(t, nil, 1, noCAClock)
	a := &adminService{s: b.srvs[0]}
	ctx := t.Context()
	// The CLI reads the ID it rotates from without the value it would
	// not print.
	cur, err := a.GetPSKs(ctx, &musterv1.GetPSKsRequest{IdsOnly: true})
	if err != nil || cur.GetActive().GetId() == "" || cur.GetActive().GetPsk() != "" {
		t.Fatalf("GetPSKs ids_only = %v, %v; want the active PSK's ID without its value", cur, err)
	}
	req := &musterv1.RotatePSKRequest{Grace: durationpb.New(0), FromId: cur.GetActive().GetId()}
	first, err := a.RotatePSK(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.RotatePSK(ctx, req)
	if status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "muster psk show") ||
		!strings.Contains(err.Error(), first.GetActive().GetId()) {
		t.Fatalf("second rotation from %s = %v; want ABORTED naming %s and muster psk show", req.FromId, err, first.GetActive().GetId())
	}
	ps, err := b.store.ListPSKs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if (p.Status == store.PSKActive) != (p.ID == first.GetActive().GetId()) {
			t.Fatalf("after a refused second rotation: %+v; want %s alone active", ps, first.GetActive().GetId())
		}
	}
}
