package authority

import (
	"testing"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/spiffeid"
)

// TestIssuerRole: a refused caller's certificate is checked against the
// intermediates of its identity's role, admin and agent identities only
// (claimedActor); any other role names no issuer, and the caller is
// recorded by nothing it claims.
func TestIssuerRole(t *testing.T) {
	for _, tt := range []struct {
		role spiffeid.Role
		want ca.Role
		ok   bool
	}{
		{spiffeid.RoleAdmin, ca.RoleAdmin, true},
		{spiffeid.RoleAgent, ca.RoleAgent, true},
		{spiffeid.RoleAuthority, "", false},
		{"", "", false},
		{"workload", "", false},
	} {
		if got, ok := issuerRole(tt.role); got != tt.want || ok != tt.ok {
			t.Errorf("issuerRole(%q) = %q, %v; want %q, %v", tt.role, got, ok, tt.want, tt.ok)
		}
	}
}
