package e2e

import (
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/identity"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// operatorAdmin is the admin API as the operator init created.
func operatorAdmin(t *testing.T, dir, addr string) musterv1.AdminServiceClient {
	t.Helper()
	op, err := identity.Load(filepath.Join(dir, "operator.pem"))
	if err != nil {
		t.Fatal(err)
	}
	return dialAdmin(t, dir, addr, op)
}

// TestAdminInputsAreBounded: a lock target that names nothing a join or
// renewal could match, and an audit page size out of range, are refused
// with INVALID_ARGUMENT and a reason, audited, and change nothing.
func TestAdminInputsAreBounded(t *testing.T) {
	dir, _ := initDir(t)
	auth := startAuthority(t, dir)
	c := operatorAdmin(t, dir, auth.addr)
	for _, tt := range []struct{ kind, target, want string }{
		{"node", "../x", "name"},
		{"node", "Node-1", "name"},
		{"admin", "a/b", "name"},
		{"instance", "../x", "UUID"},
		{"instance", "0AF1E2D3-0000-4000-8000-000000000000", "UUID"},
		{"token", "ABCDEF", "6 of a-z 0-9"},
		{"token", "abc", "6 of a-z 0-9"},
	} {
		_, err := c.CreateLock(t.Context(), &musterv1.CreateLockRequest{Kind: tt.kind, Target: tt.target})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tt.want) {
			t.Errorf("lock %s %q: %v, want INVALID_ARGUMENT naming %q", tt.kind, tt.target, err, tt.want)
		}
	}
	if l, err := c.ListLocks(t.Context(), &musterv1.ListLocksRequest{}); err != nil || len(l.GetLocks()) != 0 {
		t.Fatalf("locks after refusals: %v, %v", l.GetLocks(), err)
	}
	for _, limit := range []int32{-1, 1001} {
		_, err := c.ListAudit(t.Context(), &musterv1.ListAuditRequest{Limit: limit})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "limit") {
			t.Errorf("ListAudit limit %d: %v, want INVALID_ARGUMENT", limit, err)
		}
	}
	if r, err := c.ListAudit(t.Context(), &musterv1.ListAuditRequest{Limit: 2}); err != nil || len(r.GetRecords()) != 2 {
		t.Fatalf("ListAudit limit 2: %d records, %v", len(r.GetRecords()), err)
	}
	out := mustRun(t, "audit", "list", "--data", dir, "-o", "json")
	if got := strings.Count(out, `"lock.create"`); got != 7 {
		t.Errorf("%d lock.create records, want the 7 refusals", got)
	}
	if got := strings.Count(out, `"audit.list"`); got != 2 {
		t.Errorf("%d audit.list records, want the 2 refusals", got)
	}
}
