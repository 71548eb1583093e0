package agent

import (
	"os"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/muster-dev/muster/internal/errinfo"
)

// The systemd unit's comment and docs/install.md name every refusal for
// the node's standing that stops agent run (Restart=on-abnormal does not
// restart it), and the lock it waits out instead.
func TestPermanentRefusalsNamedInUnitAndInstallDoc(t *testing.T) {
	var permanent []string
	for _, r := range []string{"locked", "deleted", "superseded", "copy_detected", "certificate_unknown"} {
		err := errinfo.Error(codes.PermissionDenied, r, r)
		if standingRefusal(err) != r {
			t.Fatalf("%s is not a refusal for the node's standing", r)
		}
		if _, locked := lockedWait(err, backoffMin); !locked && !Transient(err) {
			permanent = append(permanent, r)
		}
	}
	for _, file := range []string{"../../packaging/systemd/muster-agent.service", "../../docs/install.md"} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range permanent {
			if !strings.Contains(string(b), r) {
				t.Errorf("%s does not name %s among the refusals that stop the agent", file, r)
			}
		}
	}
}
