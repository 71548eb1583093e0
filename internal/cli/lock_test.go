package cli

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestUnknownLockHint: lock delete's NOT_FOUND names muster lock list with
// the flags that reached the authority, quoted, and keeps its code; other
// errors pass unchanged.
func TestUnknownLockHint(t *testing.T) {
	af := adminFlags{data: "/var/lib/my muster", authority: "auth.example:7443", identity: "/home/me/alice.pem"}
	err := af.unknownLockHint(status.Error(codes.NotFound, `no lock "01J8"`))
	if status.Code(err) != codes.NotFound {
		t.Fatalf("code %v", status.Code(err))
	}
	want := `no lock "01J8"; the locks in force and their IDs: muster lock list --data '/var/lib/my muster' --authority auth.example:7443 --identity /home/me/alice.pem`
	if got := status.Convert(err).Message(); got != want {
		t.Errorf("hint:\n got %s\nwant %s", got, want)
	}
	if got := (&adminFlags{}).unknownLockHint(status.Error(codes.NotFound, "no lock")); !strings.HasSuffix(status.Convert(got).Message(), "muster lock list") {
		t.Errorf("no flags given: %v", got)
	}
	for _, e := range []error{status.Error(codes.PermissionDenied, "locked"), errors.New("dial")} {
		if got := af.unknownLockHint(e); got != e {
			t.Errorf("%v changed to %v", e, got)
		}
	}
}
