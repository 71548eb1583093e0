package authority

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestRotatePSKKeepsGraceUnlessTold: a rotation while the previous PSK is
// in grace is refused, naming it, the end of its grace and the way out,
// and changes nothing; with revoke_grace it revokes it and the answer and
// the audit record name it. A grace that has ended does not stand in the
// way (it is revoked as psk.expire first).
func TestRotatePSKKeepsGraceUnlessTold(t *testing.T) {
	b := startReplicas(t, nil, 1, noCAClock)
	a := &adminService{s: b.srvs[0]}
	ctx := t.Context()

	first, err := a.RotatePSK(ctx, &musterv1.RotatePSKRequest{Grace: durationpb.New(2 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if first.GetRevokedGrace() != nil {
		t.Fatalf("first rotation revoked %v; nothing was in grace", first.GetRevokedGrace())
	}
	inGrace := first.GetPrevious()
	before, err := b.store.ListPSKs(ctx)
	if err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		grace time.Duration
		hint  string
	}{
		{24 * time.Hour, "muster psk rotate --grace 24h --revoke-grace"},
		{90 * time.Minute, "muster psk rotate --grace 1h30m --revoke-grace"},
		{0, "muster psk rotate --grace 0 --revoke-grace"},
		{10 * time.Second, "muster psk rotate --grace 10s --revoke-grace"},
	} {
		_, err := a.RotatePSK(ctx, &musterv1.RotatePSKRequest{Grace: durationpb.New(c.grace)})
		until := inGrace.GetGraceExpiresAt().AsTime().UTC().Format(time.RFC3339)
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), inGrace.GetId()) ||
			!strings.Contains(err.Error(), until) || !strings.Contains(err.Error(), c.hint) {
			t.Fatalf("rotate --grace %s with %s in grace: %v; want FAILED_PRECONDITION naming it, %s and %q", c.grace, inGrace.GetId(), err, until, c.hint)
		}
	}
	after, err := b.store.ListPSKs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) || after[0].ID != before[0].ID || after[1].Status != store.PSKGrace {
		t.Fatalf("refused rotations changed the PSKs: %+v, was %+v", after, before)
	}
	recs, err := b.store.ListAudit(ctx, store.AuditFilter{Action: "psk.rotate"})
	if err != nil {
		t.Fatal(err)
	}
	denied := 0
	for _, r := range recs {
		if r.Result == "denied" && strings.Contains(r.Target, inGrace.GetId()) && strings.Contains(r.Reason, "--revoke-grace") {
			denied++
		}
	}
	if denied != 4 {
		t.Fatalf("psk.rotate records %+v; want the 4 refusals, naming %s and the way out", recs, inGrace.GetId())
	}

	// With revoke_grace: revoked, and said so.
	forced, err := a.RotatePSK(ctx, &musterv1.RotatePSKRequest{Grace: durationpb.New(time.Nanosecond), RevokeGrace: true})
	if err != nil {
		t.Fatal(err)
	}
	rg := forced.GetRevokedGrace()
	if rg.GetId() != inGrace.GetId() || rg.GetPsk() != "" || !rg.GetGraceExpiresAt().AsTime().Equal(inGrace.GetGraceExpiresAt().AsTime()) {
		t.Fatalf("revoked_grace = %v; want %s without its value, with the grace it lost", rg, inGrace.GetId())
	}
	ps, err := b.store.ListPSKs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.ID == inGrace.GetId() && p.Status != store.PSKRevoked {
			t.Fatalf("%s is %s after rotate --revoke-grace; want revoked", p.ID, p.Status)
		}
	}
	recs, err = b.store.ListAudit(ctx, store.AuditFilter{Action: "psk.rotate"})
	if err != nil {
		t.Fatal(err)
	}
	if r := recs[len(recs)-1]; r.Result != "ok" || !strings.Contains(r.Target, "revokes "+inGrace.GetId()) {
		t.Fatalf("last psk.rotate record %+v; want ok, naming the revoked %s", r, inGrace.GetId())
	}

	// The grace of a nanosecond has ended by the next rotation: nothing
	// in grace, so nothing to refuse or to name.
	next, err := a.RotatePSK(ctx, &musterv1.RotatePSKRequest{})
	if err != nil || next.GetRevokedGrace() != nil {
		t.Fatalf("rotation after the grace ended: %v, revoked %v; want it accepted, revoking nothing in grace", err, next.GetRevokedGrace())
	}
	exp, err := b.store.ListAudit(ctx, store.AuditFilter{Action: "psk.expire"})
	if err != nil {
		t.Fatal(err)
	}
	if len(exp) != 1 || !strings.Contains(exp[0].Target, forced.GetPrevious().GetId()) {
		t.Fatalf("psk.expire records %+v; want one for %s", exp, forced.GetPrevious().GetId())
	}
}
