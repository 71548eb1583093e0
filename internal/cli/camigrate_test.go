package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/muster-dev/muster/internal/authority"
	"github.com/muster-dev/muster/internal/store"
)

// TestPrintMigrationSteps: the steps printed after muster ca
// migrate-custody name the data directory it was given (quoted for a
// shell), never a DIR placeholder, and the root step fits the root
// rotation's phase: no new rotation is suggested while one is under way,
// since muster ca root rotate would refuse it.
func TestPrintMigrationSteps(t *testing.T) {
	const dir = "/srv/muster data"
	base := authority.CustodyMigrationResult{URI: "pkcs11:token=muster", Module: "/usr/lib/softhsm/libsofthsm2.so"}
	tests := []struct {
		name         string
		phase, key   string
		want, refuse []string
	}{
		{name: "no rotation", want: []string{"muster ca root rotate --data '/srv/muster data'"}, refuse: []string{"next-phase"}},
		{name: "under way, root sealed", phase: store.RootPhaseUpdateAgents, key: "sealed",
			want:   []string{"phase update_agents", "muster ca root next-phase --data '/srv/muster data'", "muster ca root rotate --data '/srv/muster data'", "before it reaches standby"},
			refuse: []string{"The root key stays where it is"}},
		{name: "under way, root in the token", phase: store.RootPhaseInit, key: "pkcs11:token=muster;object=muster-ca/root/1",
			want: []string{"in the token already", "muster ca root next-phase --data '/srv/muster data'"}, refuse: []string{"root rotate"}},
		{name: "standby, root in the token", phase: store.RootPhaseStandby, key: "pkcs11:token=muster;object=muster-ca/root/1",
			want: []string{"in the token already"}, refuse: []string{"root rotate", "next-phase"}},
		{name: "standby, root sealed", phase: store.RootPhaseStandby, key: "sealed",
			want: []string{"muster ca root rotate --data '/srv/muster data'"}, refuse: []string{"next-phase"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := base
			res.RootRotation, res.RootKey = tt.phase, tt.key
			var b bytes.Buffer
			printMigration(&b, res, dir, "")
			out := b.String()
			if strings.Contains(out, "DIR") {
				t.Errorf("a DIR placeholder is printed although --data was given:\n%s", out)
			}
			for _, w := range append(tt.want,
				"muster-pkcs11 authority --data '/srv/muster data'",
				"muster ca rotate $role --activate --data '/srv/muster data'",
				"muster signer activate --data '/srv/muster data'",
				"muster ca migrate-custody --data '/srv/muster data' --custody 'pkcs11:token=muster' --rollback") {
				if !strings.Contains(out, w) {
					t.Errorf("missing %q in:\n%s", w, out)
				}
			}
			for _, r := range tt.refuse {
				if strings.Contains(out, r) {
					t.Errorf("%q printed in:\n%s", r, out)
				}
			}
		})
	}
}
