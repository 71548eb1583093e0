package cli

import (
	"strings"
	"testing"
)

const tokenYAML = `kind: token
metadata: {name: build-runner-01}
spec:
  join_method: bound-keypair
  node: build-runner-01
  bound_keypair:
    onboarding:
      initial_public_key: ""
      registration_secret: ""
      must_register_before: "2030-01-01T00:00:00Z"
    recovery:
      limit: 3
      mode: relaxed
    rotate_after: ""
`

func TestParseTokenFile(t *testing.T) {
	req, err := parseTokenFile([]byte(tokenYAML))
	if err != nil {
		t.Fatal(err)
	}
	b := req.GetBoundKeypair()
	if req.GetName() != "build-runner-01" || req.GetNodeId() != "build-runner-01" || b.GetRecoveryLimit() != 3 ||
		b.GetRecoveryMode() != "relaxed" || b.GetMustRegisterBefore().AsTime().Year() != 2030 || b.GetRotateAfter() != nil {
		t.Fatalf("parsed %+v", req)
	}
	defaults, err := parseTokenFile([]byte("kind: token\nmetadata: {name: a}\nspec: {join_method: bound-keypair, node: a}\n"))
	if err != nil || defaults.GetBoundKeypair().GetRecoveryLimit() != 1 || defaults.GetBoundKeypair().GetRecoveryMode() != "standard" {
		t.Fatalf("defaults: %+v, %v", defaults, err)
	}
	if req.GetSvidUsage() != "" {
		t.Errorf("svid_usage %q without one in the file", req.GetSvidUsage())
	}
	if got, err := parseTokenFile([]byte(strings.Replace(tokenYAML, "  node: build-runner-01", "  node: build-runner-01\n  svid_usage: client,server", 1))); err != nil ||
		got.GetSvidUsage() != "client,server" {
		t.Fatalf("spec.svid_usage: %+v, %v", got, err)
	}
	if _, err := parseTokenFile([]byte(tokenYAML + "status: null\n")); err != nil {
		t.Fatalf("an empty status is refused: %v", err)
	}
	// A status, as token get -o yaml prints it, is the authority's: ignored.
	if got, err := parseTokenFile([]byte(tokenYAML + "status:\n  bound_keypair: {recovery_count: 7}\n  anything: else\n")); err != nil ||
		got.GetBoundKeypair().GetRecoveryLimit() != 3 {
		t.Fatalf("a file with a status: %+v, %v", got, err)
	}
	for _, tc := range []struct{ name, yaml, field string }{
		{"unknown key", strings.Replace(tokenYAML, "mode: relaxed", "mode: relaxed\n      modee: x", 1), "modee"},
		{"wrong type", strings.Replace(tokenYAML, "limit: 3", "limit: three", 1), "three"},
		{"bad time", strings.Replace(tokenYAML, "2030-01-01T00:00:00Z", "tomorrow", 1), "must_register_before"},
		{"secret chosen", strings.Replace(tokenYAML, `registration_secret: ""`, `registration_secret: "abc"`, 1), "registration_secret"},
		{"join token", strings.Replace(tokenYAML, "join_method: bound-keypair", "join_method: token", 1), "join_method"},
		{"kind", strings.Replace(tokenYAML, "kind: token", "kind: node", 1), "kind"},
		{"empty", "", "empty"},
		{"too large", strings.Repeat("#", maxTokenFile+1), "larger"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := parseTokenFile([]byte(tc.yaml)); err == nil || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("err = %v, want one naming %q", err, tc.field)
			}
		})
	}
}

func FuzzParseTokenFile(f *testing.F) {
	f.Add([]byte(tokenYAML))
	f.Add([]byte("kind: token\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := parseTokenFile(data)
		if err == nil && req.GetBoundKeypair() == nil {
			t.Fatal("accepted a file without a bound-keypair spec")
		}
	})
}

// TestTokenFileErrorsNameFields: a misspelt key is named by its path with
// the keys valid where it stands, never with the Go type it missed.
func TestTokenFileErrorsNameFields(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"recovery", strings.Replace(tokenYAML, "limit: 3", "limt: 3", 1),
			`line 12: unknown field "spec.bound_keypair.recovery.limt"; valid here: limit, mode`},
		{"top level", "kind: token\nmetdata: {name: a}\n",
			`line 2: unknown field "metdata"; valid here: kind, metadata, spec, status`},
		{"flow mapping", "kind: token\nmetadata: {name: a, nmae: b}\n",
			`line 2: unknown field "metadata.nmae"; valid here: name`},
		{"wrong type", strings.Replace(tokenYAML, "limit: 3", "limit: three", 1),
			`line 12: spec.bound_keypair.recovery.limit: want a number, not "three"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseTokenFile([]byte(tc.yaml))
			if err == nil || err.Error() != tc.want {
				t.Fatalf("err = %v\nwant   %s", err, tc.want)
			}
		})
	}
}
