package agent

import (
	"log/slog"
	"strings"
	"testing"
)

// TestRebindNamesWhatTheAuthorityDid: a rebind with a valid certificate
// asks for a refresh, but the authority may answer it with a new
// instance (a resync, or a recovery's lost reply retried): the log names
// what the answer says was done, not what was asked.
func TestRebindNamesWhatTheAuthorityDid(t *testing.T) {
	for _, tc := range []struct {
		name, instance, want string
	}{
		{"same instance", "instance-1", `"msg":"refresh done"`},
		{"new instance", "instance-2", `"msg":"recovery done"`},
		{"no instance in the answer", "", `"msg":"refresh or recovery done"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAuthority(t, fakeOptions{})
			_, dir := boundJoined(t, f)
			f.mu.Lock()
			f.boundInstance = &tc.instance
			f.mu.Unlock()
			var logs syncBuffer
			a := New(Options{Dir: dir, Log: slog.New(slog.NewJSONHandler(&logs, nil))})
			if _, err := a.Rebind(t.Context()); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(logs.String(), tc.want) {
				t.Fatalf("log %s, want %s", logs.String(), tc.want)
			}
		})
	}
}
