package cli

import (
	"testing"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestRollbackTarget: muster signer rollback names the signer the
// authority's plan moves: the staged one, else the active one.
func TestRollbackTarget(t *testing.T) {
	s := func(id, state string) *musterv1.Signer { return &musterv1.Signer{VersionId: id, State: state} }
	for _, c := range []struct {
		name string
		in   []*musterv1.Signer
		want string
	}{
		{"staged before effect", []*musterv1.Signer{s("v1", "active"), s("v2-ab", "staged")}, "v2-ab"},
		{"active inside grace", []*musterv1.Signer{s("v1", "grace"), s("v2-ab", "active")}, "v2-ab"},
		{"staged again after a rollback", []*musterv1.Signer{s("v2-ab", "staged"), s("v1", "active")}, "v2-ab"},
		{"ended ones ignored", []*musterv1.Signer{s("v1", "retired"), s("v2-ab", "active"), s("v3-cd", "revoked")}, "v2-ab"},
		{"none", nil, ""},
	} {
		if got := rollbackTarget(c.in); got != c.want {
			t.Errorf("%s: rollbackTarget = %q, want %q", c.name, got, c.want)
		}
	}
}
