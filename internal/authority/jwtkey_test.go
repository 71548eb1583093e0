package authority

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/jwtbundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// The JWT-SVID key rotates on demand (RotateJWTKey) and on its period,
// once per version across replicas (the other replica follows by
// re-reading the store), audited either way; a second rotation before the
// key two back can have no valid token is refused, saying when to retry.
func TestJWTKeyRotation(t *testing.T) {
	t.Parallel()
	b := startReplicas(t, nil, 2)
	r0, r1 := b.srvs[0], b.srvs[1]
	ctx := t.Context()
	if v0, v1 := r0.jwt.Load().Version(), r1.jwt.Load().Version(); v0 != 1 || v1 != 1 {
		t.Fatalf("fresh replicas sign with versions %d and %d, want 1", v0, v1)
	}
	before := r0.jwt.Load().KeyID()
	resp, err := (&adminService{s: r0}).RotateJWTKey(ctx, &musterv1.RotateJWTKeyRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetVersion() != 2 || resp.GetPreviousKeyId() != before || resp.GetKeyId() != r0.jwt.Load().KeyID() || resp.GetKeyId() == before {
		t.Fatalf("rotate: %+v; replica signs with %s", resp, r0.jwt.Load().KeyID())
	}
	deadline := time.Now().Add(3 * jwtKeyTick)
	for r1.jwt.Load().Version() != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the other replica still signs with version %d", r1.jwt.Load().Version())
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, err = (&adminService{s: r1}).RotateJWTKey(ctx, &musterv1.RotateJWTKeyRequest{})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "run `muster ca rotate jwt` again after") {
		t.Fatalf("a second rotation at once: %v", err)
	}
	if k, _ := b.store.GetJWTKey(ctx); k.Version != 2 {
		t.Fatalf("the refused rotation moved the version to %d", k.Version)
	}
	// The period: not due, nothing; due, one rotation by the authority.
	if err := r1.jwtKeyStepWith(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := r1.jwtKeyStepWith(ctx, time.Nanosecond); err != nil {
		t.Fatal(err)
	}
	if k, _ := b.store.GetJWTKey(ctx); k.Version != 3 || r1.jwt.Load().Version() != 3 {
		t.Fatalf("after the period: store version %d, replica %d; want 3", k.Version, r1.jwt.Load().Version())
	}
	recs, err := b.store.ListAudit(ctx, store.AuditFilter{Action: "jwt.rotate"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range recs {
		got = append(got, r.Actor+" "+r.Target+" "+r.Result)
	}
	if len(recs) != 3 || recs[0].Result != audit.ResultOK || recs[0].Target != "jwt-svid/v2" || recs[1].Result != audit.ResultDenied ||
		recs[2].Actor != "authority" || recs[2].Target != "jwt-svid/v3" || recs[2].Result != audit.ResultOK {
		t.Fatalf("audit of jwt.rotate: %q", got)
	}
}

// hangingJWTKeyStore's first GetJWTKey hangs until its context ends (a
// half-open connection to the database); later ones answer version 2.
type hangingJWTKeyStore struct {
	store.Store
	calls atomic.Int64
}

func (h *hangingJWTKeyStore) GetJWTKey(ctx context.Context) (store.JWTKey, error) {
	if h.calls.Add(1) == 1 {
		<-ctx.Done()
		return store.JWTKey{}, ctx.Err()
	}
	now, err := h.Store.Now(ctx)
	return store.JWTKey{Version: 2, RotatedAt: now}, err
}

// A store call of the JWT key clock that hangs ends at the step's
// deadline: the replica goes on re-reading the version and follows a
// rotation, instead of signing with the old key forever.
func TestJWTKeyClockStepHasADeadline(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := openSQLite(t)
	st := &hangingJWTKeyStore{Store: db}
	s := &Server{store: st, cfg: Config{StorageKey: seal.StorageKey{7}}, log: slog.New(slog.DiscardHandler)}
	if err := s.useJWTKey(store.JWTKey{Version: 1}); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); s.jwtKeyClock(cctx) }()
	t.Cleanup(func() { cancel(); <-done })
	deadline := time.Now().Add(jwtKeyStepTimeout + 3*jwtKeyTick)
	for s.jwt.Load().Version() != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("after a hung store call the clock still signs with version %d (%d GetJWTKey calls): the step has no deadline",
				s.jwt.Load().Version(), st.calls.Load())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// GetJWTBundle says, by key ID, how long each published key stays in the
// JWKS on the rotation schedule (the previous version's until the next
// rotation, the current one's a period later, the next one's a period
// after that), so an agent that cannot reach the authority stops
// validating with a key the authority may have unpublished.
func TestJWTBundleSaysHowLongKeysArePublished(t *testing.T) {
	t.Parallel()
	a := startBench(t)
	ctx := t.Context()
	if _, err := (&adminService{s: a.srvs[0]}).RotateJWTKey(ctx, &musterv1.RotateJWTKeyRequest{}); err != nil {
		t.Fatal(err)
	}
	conn := a.dial(a.joinedIdentity(t, "jwks-1"))
	defer conn.Close()
	before := time.Now()
	b, err := musterv1.NewAgentServiceClient(conn).GetJWTBundle(ctx, &musterv1.GetJWTBundleRequest{})
	if err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	k, err := a.store.GetJWTKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	period := a.srvs[0].jwtKeyPeriod()
	versions := a.srvs[0].jwt.Load().KeyVersions()
	if k.Version != 2 || len(versions) != 3 {
		t.Fatalf("version %d, keys %v; want version 2 publishing 1, 2 and 3", k.Version, versions)
	}
	set, err := jwtbundle.Parse(spiffeid.RequireTrustDomainFromString(a.td), b.GetJwks())
	if err != nil {
		t.Fatal(err)
	}
	if len(b.GetPublishedFor()) != len(versions) {
		t.Fatalf("published_for %v, want one per key of %v", b.GetPublishedFor(), versions)
	}
	for kid, v := range versions {
		if !set.HasJWTAuthority(kid) {
			t.Errorf("the JWKS lacks %s", kid)
		}
		d, ok := b.GetPublishedFor()[kid]
		if !ok {
			t.Errorf("no published_for for %s (version %d)", kid, v)
			continue
		}
		leaves := k.RotatedAt.Add(time.Duration(v) * period) // v+2-2
		// Counted on the store's clock (SQLite's, this one, to the
		// millisecond), from a reading of it taken before the answer:
		// shorter by that reading's round trip at most (a second's
		// margin), never longer.
		if lo, hi := leaves.Sub(after)-time.Second, leaves.Sub(before)+time.Millisecond; d.AsDuration() < lo || d.AsDuration() > hi {
			t.Errorf("version %d published for %s, want between %s and %s (it leaves at %s)", v, d.AsDuration(), lo, hi, leaves)
		}
	}
}
