package agent

import (
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/muster-dev/muster/internal/errinfo"
)

// A bound-keypair agent's stream refused for the node's standing is told
// the bound-keypair way back, never a join with a join token (muster token
// create --node would make the node a token node beside its bound-keypair
// token, and the copy a clone left behind could take it): a refresh with
// the bound key, which agent renew makes now, or for a lock the lock's
// way out.
func TestBoundStandingHintsNoJoinToken(t *testing.T) {
	dir := Dir(filepath.Join(t.TempDir(), "agent data"))
	st := &State{NodeID: "runner-c", BoundKeypair: "runner-c", JoinMethod: JoinMethodBoundKeypair}
	for _, c := range []struct {
		reason string
		code   codes.Code
		want   string
	}{
		{"superseded", codes.PermissionDenied, "muster agent renew --data '" + string(dir) + "'"},
		{"deleted", codes.PermissionDenied, "muster agent renew --data '" + string(dir) + "'"},
		{"certificate_unknown", codes.PermissionDenied, "muster agent renew --data '" + string(dir) + "'"},
		{"locked", codes.PermissionDenied, "muster lock delete ID"},
		{"copy_detected", codes.PermissionDenied, "muster lock delete ID"},
	} {
		err := standingHint(errinfo.Error(c.code, c.reason, c.reason), st, dir)
		msg := err.Error()
		if strings.Contains(msg, "muster token create") || strings.Contains(msg, "--node") {
			t.Errorf("%s: a bound-keypair agent is told to join with a join token: %s", c.reason, msg)
		}
		if !strings.Contains(msg, c.want) {
			t.Errorf("%s: %s\nwant it to name %q", c.reason, msg, c.want)
		}
		if errinfo.Reason(err) != c.reason {
			t.Errorf("%s: the reason word became %q", c.reason, errinfo.Reason(err))
		}
	}
	// A token agent's way back is still a join with a join token.
	if msg := standingHint(errinfo.Error(codes.PermissionDenied, "superseded", "superseded"), &State{NodeID: "web-01"}, dir).Error(); !strings.Contains(msg, "muster token create --node web-01") {
		t.Errorf("token agent, superseded: %s", msg)
	}
}
