package authority

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/sqlite"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// openSQLite is a fresh SQLite store for a test.
func openSQLite(t *testing.T) *sqlite.SQLite {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// wantNoAudit fails unless the chain is empty.
func wantNoAudit(t *testing.T, st store.Store) {
	t.Helper()
	if recs, err := st.ListAudit(t.Context(), store.AuditFilter{}); err != nil || len(recs) != 0 {
		t.Fatalf("audit chain %+v (%v); want it empty", recs, err)
	}
}

func (u unauditable) RotateJWTKey(ctx context.Context, from int64, _ func(store.AuditHead) (store.AuditRecord, error)) (store.JWTKey, error) {
	return u.Store.RotateJWTKey(ctx, from, func(store.AuditHead) (store.AuditRecord, error) { return store.AuditRecord{}, u.err })
}

// TestJWTRotateUnauditedChangesNothing: a JWT-SVID key rotation whose
// jwt.rotate record cannot be written leaves the version where it was,
// whether an operator or the period asked for it, and the replica keeps
// signing with the old key. Before, the version moved first and its
// record was written after, its failure logged and dropped.
func TestJWTRotateUnauditedChangesNothing(t *testing.T) {
	st := openSQLite(t)
	s, buf := unauditedServer(t, st)
	if err := s.useJWTKey(store.JWTKey{Version: 1}); err != nil {
		t.Fatal(err)
	}
	ctx := context.WithValue(t.Context(), callerKey{}, Caller{CorrelationID: "corr-1"})
	if resp, err := (&adminService{s: s}).RotateJWTKey(ctx, &musterv1.RotateJWTKeyRequest{}); status.Code(err) != codes.Internal || resp != nil {
		t.Fatalf("RotateJWTKey = %v, %v; want Internal and no key", resp, err)
	}
	if err := s.jwtKeyStepWith(ctx, time.Nanosecond); err == nil || !strings.Contains(err.Error(), "not rotated from version 1") {
		t.Fatalf("jwtKeyStepWith = %v; want the rotation refused for its record", err)
	}
	if k, err := st.GetJWTKey(t.Context()); err != nil || k.Version != 1 {
		t.Fatalf("JWT key %+v (%v); want version 1 still", k, err)
	}
	if v := s.jwt.Load().Version(); v != 1 {
		t.Fatalf("the replica signs with version %d; want 1", v)
	}
	if !strings.Contains(buf.String(), "not rotated from version 1") {
		t.Errorf("the log does not say the key was not rotated:\n%s", buf.String())
	}
	wantNoAudit(t, st)
}

func (u unauditable) OpenResync(ctx context.Context, o store.ResyncOpen, _ func(store.ResyncEpoch) func(store.AuditHead) (store.AuditRecord, error)) (store.ResyncEpoch, error) {
	return u.Store.OpenResync(ctx, o, u.epochRecord)
}

func (u unauditable) CloseResync(ctx context.Context, by string, _ func(store.ResyncEpoch) func(store.AuditHead) (store.AuditRecord, error)) (store.ResyncEpoch, error) {
	return u.Store.CloseResync(ctx, by, u.epochRecord)
}

func (u unauditable) epochRecord(store.ResyncEpoch) func(store.AuditHead) (store.AuditRecord, error) {
	return func(store.AuditHead) (store.AuditRecord, error) { return store.AuditRecord{}, u.err }
}

// TestResyncUnauditedChangesNothing: a bound-keypair resync window whose
// bound_keypair.resync.open or .close record cannot be written is neither
// opened nor closed. Before, the window was written first and recorded
// after, the record's failure logged and dropped: a window admitting
// join states ahead of the store with nothing in the chain.
func TestResyncUnauditedChangesNothing(t *testing.T) {
	st := openSQLite(t)
	s, buf := unauditedServer(t, st)
	ctx := context.WithValue(t.Context(), callerKey{}, Caller{CorrelationID: "corr-2"})
	a := &adminService{s: s}
	req := &musterv1.OpenResyncRequest{Duration: durationpb.New(time.Hour), Reason: "restored the 02:00 backup"}
	if resp, err := a.OpenResync(ctx, req); status.Code(err) != codes.Internal || resp != nil {
		t.Fatalf("OpenResync = %v, %v; want Internal and no window", resp, err)
	}
	if list, err := st.ListResyncEpochs(t.Context()); err != nil || len(list) != 0 {
		t.Fatalf("epochs %+v (%v); want none", list, err)
	}
	if _, err := st.OpenResync(t.Context(), store.ResyncOpen{ID: "ep-1", For: time.Hour, OpenedBy: "admin:test"},
		func(store.ResyncEpoch) func(store.AuditHead) (store.AuditRecord, error) { return setupLink }); err != nil {
		t.Fatal(err)
	}
	wantOpen := func() {
		t.Helper()
		list, err := st.ListResyncEpochs(t.Context())
		if err != nil || len(list) != 1 || !list[0].ClosedAt.IsZero() {
			t.Fatalf("epochs %+v (%v); want ep-1 open", list, err)
		}
	}
	wantOpen()
	if resp, err := a.CloseResync(ctx, &musterv1.CloseResyncRequest{Reason: "done"}); status.Code(err) != codes.Internal || resp != nil {
		t.Fatalf("CloseResync = %v, %v; want Internal and no window", resp, err)
	}
	wantOpen()
	for _, want := range []string{"not opened: it opens with its bound_keypair.resync.open record", "not closed: it closes with its bound_keypair.resync.close record"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("the log does not say %q:\n%s", want, buf.String())
		}
	}
	if recs, err := st.ListAudit(t.Context(), store.AuditFilter{}); err != nil || len(recs) != 1 || recs[0].Action != "test.setup" {
		t.Fatalf("audit chain %+v (%v); want only the setup's record", recs, err)
	}
}
