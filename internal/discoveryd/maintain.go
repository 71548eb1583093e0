package discoveryd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/store"
)

// maintainLoop rotates the ticket key when it is due, drops retired keys
// past their publication and old join reports, every maintainEvery.
func (s *Server) maintainLoop(ctx context.Context) error {
	t := time.NewTicker(maintainEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			s.maintain(ctx)
		}
	}
}

func (s *Server) maintain(ctx context.Context) {
	if err := s.keys.reload(ctx); err != nil {
		s.log.Error("cannot read the ticket keys", "err", err)
		return
	}
	now, err := s.store.Now(ctx)
	if err != nil {
		s.log.Error("cannot read the store clock", "err", err)
		return
	}
	if id, created := s.keys.activeSince(); now.Sub(created) >= s.cfg.KeyRotation {
		r, err := rotate(ctx, s.store, s.sealer, id, KeyOverlap)
		switch {
		case errors.Is(err, ErrRotated):
			// Another process (a replica, rotate-key) got there first.
		case err != nil:
			s.log.Error("cannot rotate the ticket key", "err", err)
		default:
			s.metrics.rotations.Inc()
			s.log.Info("rotated the ticket key", "from", r.From, "to", r.To, "published_until", r.PublishUntil)
			s.recordOK(ctx, "ticket_key.rotate", r.To, rotationReason(r))
		}
		if err := s.keys.reload(ctx); err != nil {
			s.log.Error("cannot read the ticket keys", "err", err)
		}
	}
	deleted, err := s.store.DeleteRetiredTicketKeys(ctx)
	if err != nil {
		s.log.Error("cannot delete retired ticket keys", "err", err)
	}
	for _, id := range deleted {
		s.recordOK(ctx, "ticket_key.delete", id, "publication ended")
	}
	if n, err := s.store.DeleteJoinReports(ctx, reportRetention); err != nil {
		s.log.Error("cannot delete old join reports", "err", err)
	} else if n > 0 {
		s.log.Debug("deleted old join reports", "count", n)
	}
}

func rotationReason(r Rotation) string {
	return fmt.Sprintf("replaces %s, which stays published until %s", r.From, r.PublishUntil.UTC().Format(time.RFC3339))
}

func (s *Server) recordOK(ctx context.Context, action, target, reason string) {
	if _, err := s.audit.Record(context.WithoutCancel(ctx), audit.Event{Actor: "discovery", Action: action, Target: target,
		Result: audit.ResultOK, Reason: reason}); err != nil {
		s.log.Error("audit write failed", "action", action, "err", err)
	}
}

// RotateKey makes a new active ticket key now, through the store, whether
// or not a discovery is running on it (muster discovery rotate-key): the
// current key stays published for KeyOverlap; running servers publish the
// new one within seconds and sign with it about fifteen seconds later. With
// revoke (a key that may have leaked), the current key leaves the JWKS at
// once and the new one signs at once; tickets in flight are refused.
// ErrRotated if another rotation won the race.
func RotateKey(ctx context.Context, dir string, st store.Store, revoke bool) (Rotation, error) {
	id, err := Load(dir)
	if err != nil {
		return Rotation{}, err
	}
	if err := checkOwnStore(ctx, st); err != nil {
		return Rotation{}, err
	}
	sealer, err := id.StorageKey.Sealer(seal.InfoDiscoveryKey)
	if err != nil {
		return Rotation{}, err
	}
	keys, err := st.ListTicketKeys(ctx)
	if err != nil {
		return Rotation{}, err
	}
	from := ""
	if a := active(keys); a != nil {
		// The key must open here, or this directory's storage key is
		// not the one the store's keys are sealed with.
		if _, err := openTicketKey(sealer, *a); err != nil {
			return Rotation{}, err
		}
		from = a.ID
	}
	overlap := KeyOverlap
	if revoke {
		overlap = 0
	}
	r, err := rotate(ctx, st, sealer, from, overlap)
	if err != nil {
		return Rotation{}, err
	}
	logger, err := datadir.NewAuditLogger(st, id.StorageKey, id.Dir.CheckpointFile(), nil)
	if err != nil {
		return r, err
	}
	action, reason := "ticket_key.rotate", rotationReason(r)
	if revoke {
		reason = fmt.Sprintf("replaces %s, revoked at once", r.From)
	}
	if r.From == "" {
		action, reason = "ticket_key.create", "first ticket key"
	}
	if _, err := logger.Record(context.WithoutCancel(ctx), audit.Event{Actor: "muster discovery rotate-key", Action: action,
		Target: r.To, Result: audit.ResultOK, Reason: reason}); err != nil {
		return r, err
	}
	return r, nil
}

// checkOwnStore refuses a store an authority uses: discovery would append
// to the authority's audit chain under its own chain key, and the
// authority's muster audit verify would then report every such record as
// tampering.
func checkOwnStore(ctx context.Context, st store.Store) error {
	psks, err := st.ListPSKs(ctx)
	if err != nil {
		return fmt.Errorf("discoveryd: reading the store: %w", err)
	}
	if len(psks) > 0 {
		return errors.New("discoveryd: the store holds an authority's records; give discovery a database of its own")
	}
	return nil
}
