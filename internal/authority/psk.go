package authority

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/psk"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// pskSealer opens PSKs sealed by datadir.NewPSK. Deriving it is cheap next
// to a store round trip, so it is not cached.
func (s *Server) pskSealer() (*seal.Sealer, error) {
	return s.cfg.StorageKey.Sealer(seal.InfoPSK)
}

// expireGracePSKs revokes the grace PSKs whose grace has ended by the store
// clock. The cleaner calls it periodically; GetPSKs calls it before every
// read, so an ended grace PSK is never shown even between sweeps.
func (s *Server) expireGracePSKs(ctx context.Context) {
	if err := s.revokeExpiredGracePSKs(ctx); err != nil && ctx.Err() == nil && !s.outage.fail(err) {
		s.log.Error("revoking expired grace PSKs failed", "err", err)
	}
}

// revokeExpiredGracePSKs is expireGracePSKs returning its error. The
// revocations are written with their psk.expire record (by the
// authority) in one transaction: PSKs whose record cannot be written stay
// in grace, which admits no one past its end (enroll checks the time), and
// the next sweep revokes them.
func (s *Server) revokeExpiredGracePSKs(ctx context.Context) error {
	var link *audit.Link
	ids, err := s.store.RevokeExpiredGracePSKs(ctx, func(ids []string) func(store.AuditHead) (store.AuditRecord, error) {
		l, err := s.audit.Builder(audit.Event{Actor: "authority", Action: "psk.expire",
			Target: "psk " + strings.Join(ids, ","), Result: audit.ResultOK, Reason: "grace period ended"})
		if err != nil {
			return func(store.AuditHead) (store.AuditRecord, error) { return store.AuditRecord{}, err }
		}
		link = l
		return l.Build
	})
	if err != nil {
		return fmt.Errorf("grace PSKs not revoked: they are revoked with their psk.expire record or not at all, and the write failed: %w", err)
	}
	if len(ids) == 0 {
		return nil
	}
	s.audit.Appended(link)
	s.log.Info("revoked bootstrap PSKs whose grace ended", "psk_ids", ids)
	return nil
}

// errNoActivePSK: the store holds no active PSK, which muster init always
// creates; the database was tampered with or restored badly.
var errNoActivePSK = status.Error(codes.FailedPrecondition, "the authority has no active bootstrap PSK")

// openPSK decrypts a stored PSK. The ID is the additional data, so a
// ciphertext moved to another row does not decrypt.
func openPSK(sealer *seal.Sealer, p store.PSK) (psk.PSK, error) {
	b, err := sealer.Open(p.Ciphertext, p.Nonce, []byte(p.ID))
	if err != nil {
		return psk.PSK{}, fmt.Errorf("authority: psk %s: %w", p.ID, err)
	}
	return psk.FromBytes(b)
}

func pskToProto(p store.PSK, key psk.PSK) *musterv1.BootstrapPSK {
	m := &musterv1.BootstrapPSK{Id: p.ID, CreatedAt: timestamppb.New(p.CreatedAt)}
	if !key.IsZero() {
		m.Psk = key.Reveal()
	}
	if p.Status == store.PSKGrace {
		m.GraceExpiresAt = timestamppb.New(p.GraceExpiresAt)
	}
	return m
}

func (a *adminService) GetPSKs(ctx context.Context, req *musterv1.GetPSKsRequest) (*musterv1.GetPSKsResponse, error) {
	resp, target, err := a.getPSKs(ctx, req.GetIdsOnly())
	if req.GetIdsOnly() {
		target += " (ids only)"
	}
	err = toStatus(ctx, a.s.log, err)
	a.record(ctx, "psk.show", target, err)
	return resp, err
}

// getPSKs reads the active and grace PSKs, without their values when
// idsOnly.
func (a *adminService) getPSKs(ctx context.Context, idsOnly bool) (*musterv1.GetPSKsResponse, string, error) {
	// Lazy revocation: an ended grace is enforced on every read, not only
	// when the cleaner last ran.
	if err := a.s.revokeExpiredGracePSKs(ctx); err != nil {
		return nil, "", err
	}
	now, err := a.s.store.Now(ctx)
	if err != nil {
		return nil, "", err
	}
	ps, err := a.s.store.ListPSKs(ctx)
	if err != nil {
		return nil, "", err
	}
	sealer, err := a.s.pskSealer()
	if err != nil {
		return nil, "", err
	}
	resp := &musterv1.GetPSKsResponse{}
	var shown []string
	for _, p := range ps {
		var slot **musterv1.BootstrapPSK
		switch {
		case p.Status == store.PSKActive:
			slot = &resp.Active
		case p.Status == store.PSKGrace && now.Before(p.GraceExpiresAt):
			// A grace that ended since the sweep above is not shown.
			slot = &resp.Grace
		default:
			continue
		}
		var key psk.PSK
		if !idsOnly {
			if key, err = openPSK(sealer, p); err != nil {
				return nil, "", err
			}
		}
		*slot = pskToProto(p, key)
		shown = append(shown, p.ID)
	}
	target := "psk " + strings.Join(shown, ",")
	if resp.Active == nil {
		return nil, target, errNoActivePSK
	}
	return resp, target, nil
}

func (a *adminService) RotatePSK(ctx context.Context, req *musterv1.RotatePSKRequest) (*musterv1.RotatePSKResponse, error) {
	resp, target, err := a.rotatePSK(ctx, req)
	if err != nil {
		err = toStatus(ctx, a.s.log, err)
		a.record(ctx, "psk.rotate", target, err)
		return nil, err
	}
	return resp, nil
}

func (a *adminService) rotatePSK(ctx context.Context, req *musterv1.RotatePSKRequest) (*musterv1.RotatePSKResponse, string, error) {
	grace := psk.DefaultGrace
	if req.Grace != nil {
		if err := req.Grace.CheckValid(); err != nil {
			return nil, "", badRequest("grace: " + err.Error())
		}
		grace = req.Grace.AsDuration()
	}
	if err := psk.CheckGrace(grace); err != nil {
		return nil, "", badRequest(err.Error())
	}

	// A grace PSK whose grace has ended is revoked (and audited as
	// psk.expire) first, so that the rotation revokes only a PSK still
	// accepted, which it then names.
	if err := a.s.revokeExpiredGracePSKs(ctx); err != nil {
		return nil, "", err
	}
	now, err := a.s.store.Now(ctx)
	if err != nil {
		return nil, "", err
	}
	ps, err := a.s.store.ListPSKs(ctx)
	if err != nil {
		return nil, "", err
	}
	var from, inGrace store.PSK
	for _, p := range ps {
		switch {
		case p.Status == store.PSKActive:
			from = p
		case p.Status == store.PSKGrace && now.Before(p.GraceExpiresAt):
			inGrace = p
		}
	}
	if from.ID == "" {
		return nil, "", errNoActivePSK
	}
	target := "psk " + from.ID
	if want := req.GetFromId(); want != "" && want != from.ID {
		// The operator means to replace want: another rotation got there
		// first, and going on would replace (and with --grace 0s revoke)
		// that rotation's new key instead. The store's write below is
		// conditional on from being active, so this check holds to it.
		return nil, target, status.Error(codes.Aborted, fmt.Sprintf(
			"the bootstrap PSK %s was already replaced (the active one is now %s: another rotation got there first), so nothing was rotated: run muster psk show, then muster psk rotate again if it is still wanted",
			want, from.ID))
	}
	if inGrace.ID != "" {
		target += " (in grace: " + inGrace.ID + ")"
		if !req.RevokeGrace {
			// Agents, discovery-fed machines and secret managers not yet
			// given the active PSK may still join with the one in grace:
			// revoking it is the operator's decision, never a side effect.
			return nil, target, status.Error(codes.FailedPrecondition, fmt.Sprintf(
				"the bootstrap PSK %s is still in grace until %s (machines not yet given the active PSK may still join with it), and a rotation now would revoke it: "+
					"wait until then, or revoke it with this rotation: muster psk rotate --grace %s --revoke-grace",
				inGrace.ID, inGrace.GraceExpiresAt.UTC().Format(time.RFC3339), graceText(grace)))
		}
	}

	key, next, err := datadir.NewPSK(a.s.cfg.StorageKey, now)
	if err != nil {
		return nil, target, err
	}
	target = fmt.Sprintf("psk %s (replaces %s)", next.ID, from.ID)
	if inGrace.ID != "" {
		target = fmt.Sprintf("psk %s (replaces %s; revokes %s, in grace until %s)", next.ID, from.ID, inGrace.ID,
			inGrace.GraceExpiresAt.UTC().Format(time.RFC3339))
	}
	// The store revokes whatever PSK is in grace when it rotates from
	// from. Only a rotation (which replaces the active PSK) puts a PSK in
	// grace, so while from is still active, as the store checks in the
	// same transaction, the PSK in grace is inGrace or, its grace having
	// just ended, none: the answer names what was revoked.
	// The rotation is written with its record, or not at all: a PSK
	// that cannot be audited is not handed out.
	link, err := a.link(ctx, "psk.rotate", target, "")
	if err != nil {
		return nil, target, err
	}
	old, err := a.s.store.RotatePSK(ctx, from.ID, next, grace, link.Build)
	if errors.Is(err, store.ErrConflict) {
		// The store checked inside its transaction that from was still
		// active: another rotation got there first.
		return nil, target, status.Error(codes.Aborted,
			"the bootstrap PSK was rotated concurrently; run muster psk show and rotate again if needed")
	}
	if err != nil {
		return nil, target, fmt.Errorf("psk %s not rotated: it is rotated with its audit record or not at all, and the write failed: %w", from.ID, err)
	}
	a.s.audit.Appended(link)
	resp := &musterv1.RotatePSKResponse{Active: pskToProto(next, key), Previous: pskToProto(old, psk.PSK{})}
	if inGrace.ID != "" {
		resp.RevokedGrace = pskToProto(inGrace, psk.PSK{})
	}
	return resp, target, nil
}

// graceText is a grace as --grace takes it, short: 24h, 1h30m, 10s, 0.
func graceText(grace time.Duration) string {
	if grace == 0 {
		return "0"
	}
	t := grace.String()
	if strings.HasSuffix(t, "m0s") {
		t = strings.TrimSuffix(t, "0s")
	}
	if strings.HasSuffix(t, "h0m") {
		t = strings.TrimSuffix(t, "0m")
	}
	return t
}
