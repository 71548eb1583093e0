package cli

import (
	"testing"

	"github.com/muster-dev/muster/internal/signer"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestRollbackTarget: muster signer rollback names the signer the
// authority's plan moves: the staged one, else the active one; activate
// names the staged one and retire the one in grace.
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
		if got := signerIn(c.in, []signer.State{signer.Staged, signer.Active}); got != c.want {
			t.Errorf("%s: rollback target = %q, want %q", c.name, got, c.want)
		}
	}
	ss := []*musterv1.Signer{s("v1", "retired"), s("v2-ab", "grace"), s("v3-cd", "active"), s("v4-ef", "staged")}
	if got := signerIn(ss, []signer.State{signer.Staged}); got != "v4-ef" {
		t.Errorf("activate target = %q, want v4-ef", got)
	}
	if got := signerIn(ss, []signer.State{signer.Grace}); got != "v2-ab" {
		t.Errorf("retire target = %q, want v2-ab", got)
	}
}
