package e2e

import (
	"fmt"
	"os"
	"testing"
)

// requiredHere says whether a test must run rather than skip when what it
// needs is missing: when env (MUSTER_REQUIRE_*, set by .ci/run) or CI is
// set, a skip would be a check CI never makes.
func requiredHere(getenv func(string) string, env string) bool {
	return getenv(env) != "" || getenv("CI") != ""
}

// skipUnlessRequired skips t for want of what the message names, or fails
// it where the test is required (requiredHere).
func skipUnlessRequired(t *testing.T, env, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if requiredHere(os.Getenv, env) {
		t.Fatalf("%s, and %s or CI is set", msg, env)
	}
	t.Skip(msg)
}

func TestRequiredHere(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  map[string]string
		want bool
	}{
		{map[string]string{}, false},
		{map[string]string{"MUSTER_REQUIRE_X": "1"}, true},
		{map[string]string{"CI": "true"}, true},
		{map[string]string{"MUSTER_REQUIRE_Y": "1"}, false},
	} {
		if got := requiredHere(func(k string) string { return tc.env[k] }, "MUSTER_REQUIRE_X"); got != tc.want {
			t.Errorf("requiredHere with %v: %v, want %v", tc.env, got, tc.want)
		}
	}
}
