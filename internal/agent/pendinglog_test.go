package agent

import (
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/muster-dev/muster/internal/errinfo"
	"github.com/muster-dev/muster/internal/shellword"
)

// TestPendingProofLogNamesTheDataDirectory: the bound key refused while a
// rotation is pending is logged with the way out the authority named, its
// --data ADIR filled with this agent's directory (as the other agent log
// lines are), so the line can be pasted. It was logged with ADIR.
func TestPendingProofLogNamesTheDataDirectory(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	a, dir := boundJoined(t, f)
	if _, err := a.newPendingBoundKey(); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	a.log = slog.New(slog.NewTextHandler(&logs, nil))
	f.mu.Lock()
	f.boundErrs = []error{errinfo.Error(codes.Unauthenticated,
		"bound key does not match; compare muster agent status --data ADIR with muster token get bk", reasonChallengeFailed)}
	f.mu.Unlock()
	_, _ = a.Rebind(t.Context()) // its outcome is not what this test is about

	var line string
	for l := range strings.Lines(logs.String()) {
		if strings.Contains(l, "rotation is pending") {
			line = l
		}
	}
	if line == "" {
		t.Fatalf("no line about the refused bound key; the log:\n%s", logs.String())
	}
	if want := "--data " + shellword.Quote(string(dir)) + " "; strings.Contains(line, "ADIR") || !strings.Contains(line, want) {
		t.Errorf("the line %q does not name the data directory (%q)", line, want)
	}
}
