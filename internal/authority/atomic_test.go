package authority

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
