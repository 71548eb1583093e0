package softhsmtest

import "testing"

// TestRequired: a missing SoftHSM2 fails the tests where RequireEnv is 1
// or CI is set, as pgtest and e2e do; it used to skip in CI unless
// RequireEnv was set.
func TestRequired(t *testing.T) {
	for _, tc := range []struct {
		require, ci string
		want        bool
	}{
		{"", "", false},
		{"yes", "", false},
		{"1", "", true},
		{"", "true", true},
		{"1", "1", true},
	} {
		t.Setenv(RequireEnv, tc.require)
		t.Setenv("CI", tc.ci)
		if got := required(); got != tc.want {
			t.Errorf("%s=%q CI=%q: required %v, want %v", RequireEnv, tc.require, tc.ci, got, tc.want)
		}
	}
}
