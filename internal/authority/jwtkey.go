package authority

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/jwtsvid"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// The JWT-SVID signing key's rotation (docs/workload-api.md). The keys
// are derived from the storage key by version and salt; the store holds
// the current version and the salts, which one conditional write moves
// on. Every replica
// re-reads it every jwtKeyTick and signs with that version's key; the
// JWKS it serves holds the previous, current and next versions' keys, so
// a token signed by any replica just before or after a rotation verifies
// with any replica's JWKS.
const (
	// DefaultJWTKeyRotationPeriod is jwt_svid.key_rotation_period's default.
	DefaultJWTKeyRotationPeriod = 30 * 24 * time.Hour
	// jwtKeyLag bounds how long a replica may sign with a version after
	// another rotated it away (it re-reads every jwtKeyTick), with margin.
	jwtKeyLag  = time.Minute
	jwtKeyTick = 5 * time.Second
	// jwtKeyStepTimeout bounds one step's store calls: a store call that
	// hangs (a half-open connection to PostgreSQL, a row lock held by a
	// stuck transaction) must not stop this replica re-reading the
	// version, or it would go on signing with a key the others' JWKS
	// drop two rotations later. Within jwtKeyLag, so a replica that
	// missed one tick still follows in time. Longer than the store's own
	// deadline for a request (limits.store_timeout, at most 20 s, and 5 s
	// for pgx to give a cancelled one up): a database that hangs is then
	// the store's unavailability, logged once for the outage, not this
	// step's deadline, logged every tick (at 10 s, the default store
	// timeout's, it was the step's deadline that ran out first).
	jwtKeyStepTimeout = 30 * time.Second
	// MinJWTKeyRotationPeriod is the shortest period, and the least time
	// between two rotations: a token signed with the key two rotations
	// back must have expired (jwtsvid.TTL after the last replica stopped
	// signing with it), since the JWKS drops that key.
	MinJWTKeyRotationPeriod = jwtsvid.TTL + jwtKeyLag
)

// loadJWTKey reads the current version at start.
func (s *Server) loadJWTKey() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	k, err := s.store.GetJWTKey(ctx)
	if err != nil {
		return fmt.Errorf("authority: reading the JWT-SVID key version: %w", err)
	}
	if _, err := s.readStoreClock(ctx); err != nil {
		return fmt.Errorf("authority: reading the store's clock: %w", err)
	}
	return s.useJWTKey(k)
}

// storeReading is the store's clock (at) read at a time of this
// replica's clock (local, monotonic): the store's now is later at plus
// the time since local, whatever this replica's clock says the date is.
// local is taken before the read, so that now is never earlier than the
// store's: the publication times it makes are short by the read's round
// trip at most, never long.
type storeReading struct{ at, local time.Time }

func (r *storeReading) now() time.Time { return r.at.Add(time.Since(r.local)) }

// readStoreClock reads the store's clock and keeps the reading
// (storeClock).
func (s *Server) readStoreClock(ctx context.Context) (time.Time, error) {
	local := time.Now()
	now, err := s.store.Now(ctx)
	if err != nil {
		return time.Time{}, err
	}
	s.storeClock.Store(&storeReading{at: now, local: local})
	return now, nil
}

// jwtSalts are the salts k's version derives its keys with.
func jwtSalts(k store.JWTKey) jwtsvid.Salts {
	return jwtsvid.Salts{Prev: k.PrevSalt, Cur: k.Salt, Next: k.NextSalt}
}

// useJWTKey makes k's version the one this replica signs with, unless it
// already signs with a later one. One of the same version with other
// salts is replaced: the store was restored under this replica and
// rotated back up to the version, whose key is now another.
func (s *Server) useJWTKey(k store.JWTKey) error { return s.useJWTKeyRead(k, -1) }

// useJWTKeyRead is useJWTKey for k read from the store after
// s.jwtInstalls was seen at installs (-1: unknown). An earlier version
// than this replica signs with, read after its issuer was installed,
// is the store gone back (restored from a backup under this running
// replica): the replica follows it, as it does a version reached again
// with other salts, and does not go on signing with a version the
// restored store will reach again with another key, and publishing it,
// until it does (the key an operator rotated away after a leak).
func (s *Server) useJWTKeyRead(k store.JWTKey, installs int64) error {
	for {
		cur := s.jwt.Load()
		wentBack := cur != nil && cur.Version() > k.Version && installs >= 0 && s.jwtInstalls.Load() == installs
		if cur != nil && !wentBack && (cur.Version() > k.Version || cur.Version() == k.Version && cur.Salts() == jwtSalts(k)) {
			if cur.Version() == k.Version {
				s.jwtAt.Store(&k)
			}
			return nil
		}
		iss, err := jwtsvid.NewVersioned(s.cfg.StorageKey.Derive, k.Version, jwtSalts(k))
		if err != nil {
			return err
		}
		// Bumped first: a read begun before this install may return the
		// version it replaces, which is then not the store gone back.
		s.jwtInstalls.Add(1)
		if s.jwt.CompareAndSwap(cur, iss) {
			s.jwtAt.Store(&k)
			if len(iss.Damaged()) > 0 {
				s.log.Error("JWT-SVID keys not derived: "+s.jwtSaltWayOut(iss), "version", k.Version, "damaged_versions", iss.Damaged())
			}
			switch {
			case wentBack:
				s.log.Warn("the store's JWT-SVID key version went back (restored from a backup under this replica): signing with the store's version, not the one it replaced (docs/workload-api.md \"After a restore\")",
					"version", k.Version, "kid", iss.KeyID(), "replaced_version", cur.Version(), "replaced_kid", cur.KeyID())
			case cur != nil:
				s.log.Info("JWT-SVID signing key rotated", "version", k.Version, "kid", iss.KeyID(), "previous_kid", cur.KeyID())
			}
			return nil
		}
	}
}

// jwtSaltWayOut says which of iss's keys have a damaged salt in the
// store (jwtsvid.ErrSalt: a damaged or hand-edited jwt_svid_key row),
// what that stops, and the way out: rotations, each moving the versions
// along, until neither the current version nor the next one is damaged;
// a damaged previous version is only left out of the JWKS until the next
// rotation drops it.
func (s *Server) jwtSaltWayOut(iss *jwtsvid.Issuer) string {
	var cur, next bool
	for _, v := range iss.Damaged() {
		cur = cur || v == iss.Version()
		next = next || v == iss.Version()+1
	}
	what := fmt.Sprintf("the store's salt of JWT-SVID key version(s) %v is not lowercase hexadecimal (a damaged or hand-edited jwt_svid_key row), and no key is derived from it: those keys are not published", iss.Damaged())
	rotate := "`muster ca rotate jwt --data " + s.onlineData() + "`"
	switch {
	case cur && next:
		return what + fmt.Sprintf(", and version %d signs no JWT-SVID (refused) nor will %d: run %s twice, 6 minutes apart (each is refused within 6 minutes of the last rotation and says when to run it again); the key of the version after is drawn anew", iss.Version(), iss.Version()+1, rotate)
	case cur:
		return what + fmt.Sprintf(", and version %d signs no JWT-SVID (refused): run %s (refused within 6 minutes of the last rotation, saying when to run it again); the next version's key, published already, signs from then on", iss.Version(), rotate)
	case next:
		return what + fmt.Sprintf("; version %d signs, but the rotation that makes %d current leaves JWT-SVIDs refused until the one after: run %s twice, 6 minutes apart, at a quiet time", iss.Version(), iss.Version()+1, rotate)
	}
	return what + fmt.Sprintf("; tokens signed with version %d no longer verify here (they expire within 5 minutes of being signed), and the next rotation drops it: nothing to do", iss.Version()-1)
}

// publishedFor is, by key ID, how long from now iss's keys stay in the
// JWKS on the rotation schedule: version v's key leaves at the rotation
// that makes v+2 current, period after period from when the current
// version became current. Agents that cannot reach the authority stop
// validating with a key then (docs/workload-api.md). Nil when the
// version read with its rotation time is not iss's (a rotation between
// the two reads), or the store's clock was never read: the agent then
// keeps the keys the minimum period.
//
// Now is the store's: the rotation time is the store's, and so is the
// clock that rotates (jwtKeyStepWith); by this replica's, a replica
// whose clock runs ahead of the store's by a few minutes made every key's
// time that much shorter, one behind that much longer.
func (s *Server) publishedFor(iss *jwtsvid.Issuer) map[string]time.Duration {
	k, r := s.jwtAt.Load(), s.storeClock.Load()
	if k == nil || r == nil || k.Version != iss.Version() {
		return nil
	}
	now := r.now()
	period := s.jwtKeyPeriod()
	m := map[string]time.Duration{}
	for kid, v := range iss.KeyVersions() {
		m[kid] = max(0, k.RotatedAt.Add(time.Duration(v+2-k.Version)*period).Sub(now))
	}
	return m
}

// jwtKeyPeriod is jwt_svid.key_rotation_period, a shared setting.
func (s *Server) jwtKeyPeriod() time.Duration { return s.shared().JWTKeyRotationPeriod }

// jwtKeyClock re-reads the version on every replica and, when it has
// been current for the period, rotates it (one replica's conditional
// write wins; the others read the result).
func (s *Server) jwtKeyClock(ctx context.Context) {
	t := time.NewTicker(jwtKeyTick)
	defer t.Stop()
	for {
		sctx, cancel := context.WithTimeout(ctx, jwtKeyStepTimeout)
		err := s.jwtKeyStep(sctx)
		cancel()
		if err != nil && ctx.Err() == nil && !s.outage.fail(err) {
			s.log.Error("JWT-SVID key rotation step failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Server) jwtKeyStep(ctx context.Context) error {
	return s.jwtKeyStepWith(ctx, s.jwtKeyPeriod())
}

// jwtKeyStepWith re-reads the version and rotates it if it has been
// current for period.
func (s *Server) jwtKeyStepWith(ctx context.Context, period time.Duration) error {
	installs := s.jwtInstalls.Load()
	k, err := s.store.GetJWTKey(ctx)
	if err != nil {
		return err
	}
	if err := s.useJWTKeyRead(k, installs); err != nil {
		return err
	}
	now, err := s.readStoreClock(ctx)
	if err != nil {
		return err
	}
	if now.Before(k.RotatedAt.Add(period)) {
		return nil
	}
	why := fmt.Sprintf("version %d was current for the rotation period (%s)", k.Version, period)
	_, err = s.rotateJWTKey(ctx, k, audit.Event{Actor: "authority", Reason: why})
	if errors.Is(err, store.ErrConflict) {
		return nil // another replica rotated it; the next step reads it
	}
	if err != nil {
		_ = s.recordAudit(ctx, audit.Event{Actor: "authority", Action: "jwt.rotate", Target: jwtKeyTarget(k.Version + 1),
			Result: audit.ResultError, Reason: err.Error()})
		return err
	}
	return nil
}

func jwtKeyTarget(version int64) string { return fmt.Sprintf("jwt-svid/v%d", version) }

// rotateJWTKey moves the version on from k (ErrConflict when another
// rotation came first) and signs with the new one at once. The rotation
// is written with its jwt.rotate record (e, whose action, target and
// result are set here) in one transaction, or not at all: a new key is
// never in use unaudited.
func (s *Server) rotateJWTKey(ctx context.Context, k store.JWTKey, e audit.Event) (store.JWTKey, error) {
	e.Action, e.Target, e.Result = "jwt.rotate", jwtKeyTarget(k.Version+1), audit.ResultOK
	link, err := s.audit.Builder(e)
	if err != nil {
		return store.JWTKey{}, err
	}
	next, err := s.store.RotateJWTKey(ctx, k, link.Build)
	if errors.Is(err, store.ErrConflict) {
		return store.JWTKey{}, err
	}
	if err != nil {
		return store.JWTKey{}, fmt.Errorf("JWT-SVID key not rotated from version %d: it is rotated with its jwt.rotate record or not at all, and the write failed: %w", k.Version, err)
	}
	s.audit.Appended(link)
	return next, s.useJWTKey(next)
}

// RotateJWTKey rotates the JWT-SVID signing key now (muster ca rotate
// jwt), audited as jwt.rotate.
func (a *adminService) RotateJWTKey(ctx context.Context, _ *musterv1.RotateJWTKeyRequest) (*musterv1.RotateJWTKeyResponse, error) {
	resp, err := a.rotateJWTKey(ctx)
	if err != nil {
		// The rotation is recorded with its write; a refusal here.
		err = toStatus(ctx, a.s.log, err)
		a.record(ctx, "jwt.rotate", "jwt-svid", err)
		return nil, err
	}
	a.s.log.Info("JWT-SVID signing key rotated by an operator", "version", resp.GetVersion(), "kid", resp.GetKeyId(),
		"operator", callerFrom(ctx).Actor())
	return resp, nil
}

func (a *adminService) rotateJWTKey(ctx context.Context) (*musterv1.RotateJWTKeyResponse, error) {
	k, err := a.s.store.GetJWTKey(ctx)
	if err != nil {
		return nil, err
	}
	now, err := a.s.store.Now(ctx)
	if err != nil {
		return nil, err
	}
	// The JWKS after this rotation no longer holds version k-1's key:
	// tokens signed with it must have expired.
	if after := k.RotatedAt.Add(MinJWTKeyRotationPeriod); k.Version > 1 && now.Before(after) {
		return nil, status.Errorf(codes.FailedPrecondition,
			"the JWT-SVID key was rotated to version %d at %s; tokens signed with version %d may be valid until %s, and the next rotation unpublishes that key: run `muster ca rotate jwt` again after %s",
			k.Version, k.RotatedAt.UTC().Format(time.RFC3339), k.Version-1, retryAfter(after), retryAfter(after))
	}
	// A damaged salt (jwtsvid.ErrSalt) derives no key: its ID is "",
	// and the rotation is the way out of it.
	prev, err := jwtsvid.DeriveKey(a.s.cfg.StorageKey.Derive, int(k.Version), k.Salt)
	if err != nil && !errors.Is(err, jwtsvid.ErrSalt) {
		return nil, err
	}
	c := callerFrom(ctx)
	next, err := a.s.rotateJWTKey(ctx, k, audit.Event{Actor: c.Actor(), Reason: "rotated by an operator ahead of the period",
		Source: c.Source, CorrelationID: c.CorrelationID})
	if errors.Is(err, store.ErrConflict) {
		return nil, status.Errorf(codes.Aborted, "the JWT-SVID key was rotated by another request at the same time; see muster audit list --action jwt.rotate")
	}
	if err != nil {
		return nil, err
	}
	cur, err := jwtsvid.DeriveKey(a.s.cfg.StorageKey.Derive, int(next.Version), next.Salt)
	if err != nil && !errors.Is(err, jwtsvid.ErrSalt) {
		return nil, err
	}
	return &musterv1.RotateJWTKeyResponse{Version: next.Version, KeyId: cur.ID, PreviousKeyId: prev.ID,
		RotatedAt: timestamppb.New(next.RotatedAt)}, nil
}
