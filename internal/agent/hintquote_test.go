package agent

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/errinfo"
	"github.com/muster-dev/muster/internal/identity"
)

// pastedArgs runs line, a command a hint prints, as an operator pasting it
// would (sh -c), with a muster on PATH that writes the arguments it was
// given, and returns them.
func pastedArgs(t *testing.T, line string) []string {
	t.Helper()
	bin := t.TempDir()
	out := filepath.Join(t.TempDir(), "args")
	script := "#!/bin/sh\nprintf '%s\\0' \"$@\" > \"$MUSTER_ARGS_OUT\"\n"
	if err := os.WriteFile(filepath.Join(bin, "muster"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	// In a directory of its own: a substitution that ran leaves a file
	// there, not in the package's.
	cwd := t.TempDir()
	cmd := exec.Command("sh", "-c", line)
	cmd.Dir = cwd
	cmd.Env = []string{"PATH=" + bin + ":/usr/bin:/bin", "MUSTER_ARGS_OUT=" + out}
	msg, err := cmd.CombinedOutput()
	if left, _ := os.ReadDir(cwd); len(left) != 0 {
		t.Errorf("sh -c %q ran a command in its words: it made %s", line, left[0].Name())
	}
	if err != nil {
		t.Fatalf("sh -c %q: %v\n%s", line, err, msg)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("sh -c %q did not run muster: %v", line, err)
	}
	return strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00")
}

// flagValue is the word after --name in args.
func flagValue(args []string, name string) string {
	for i, a := range args {
		if a == "--"+name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// The agent's ways out name its data directory: one with a space, a quote
// or a shell metacharacter in it pastes as that one directory.
func TestHintsQuoteTheDataDirectory(t *testing.T) {
	for _, name := range []string{"agent data", "it's", "$(touch pwned)", "plain"} {
		dir := Dir(filepath.Join(t.TempDir(), name))
		st := &State{NodeID: "n1", BoundKeypair: "n1", JoinMethod: JoinMethodBoundKeypair, Authority: "127.0.0.1:7443"}
		untrusted := &identity.UntrustedRootError{Err: errors.New("x509: certificate signed by unknown authority")}
		for _, c := range []struct {
			name string
			err  error
			// cmd finds the command in the hint.
			cmd *regexp.Regexp
		}{
			{"deleted", standingHint(errinfo.Error(codes.PermissionDenied, "deleted", "deleted"), &State{NodeID: "n1"}, dir),
				regexp.MustCompile(`muster agent join .*? with a joining URI`)},
			{"untrusted, token", untrustedAuthorityHint(untrusted, &State{NodeID: "n1"}, dir),
				regexp.MustCompile(`muster agent join .*? with a joining URI`)},
			{"untrusted, bound keypair", untrustedAuthorityHint(untrusted, st, dir),
				regexp.MustCompile(`muster agent join .*? \(a recovery`)},
			// The authority's own ADIR, replaced by this agent's directory.
			{"under a root no longer trusted", standingHint(errinfo.Error(codes.Unauthenticated,
				"client certificate not issued by this authority; join again over this identity: muster agent join --force --data ADIR --node n1 with a joining URI from muster token create --node n1", "unauthenticated"), &State{NodeID: "n1"}, dir),
				regexp.MustCompile(`muster agent join .*? with a joining URI`)},
			{"bound token deleted", boundRefusalHint(errinfo.Error(codes.NotFound, "unknown bound-keypair token", "not_found"), st, dir),
				regexp.MustCompile(`muster agent join .*? --registration-secret-file F`)},
			{"join state stale", boundRefusalHint(errinfo.Error(codes.PermissionDenied, "join_state_mismatch", "join_state_mismatch"), st, dir),
				regexp.MustCompile(`muster agent join .*? --registration-secret-file F`)},
			{"challenge failed, rejoin", boundRefusalHint(errinfo.Error(codes.Unauthenticated, "challenge_failed", "challenge_failed"), st, dir),
				regexp.MustCompile(`muster agent join .*? --registration-secret-file F`)},
			{"challenge failed, status", boundRefusalHint(errinfo.Error(codes.Unauthenticated, "challenge_failed", "challenge_failed"), st, dir),
				regexp.MustCompile(`muster agent status --data .*? \(key`)},
		} {
			m := c.cmd.FindString(c.err.Error())
			if m == "" {
				t.Fatalf("%s: no command in %v", c.name, c.err)
			}
			line := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, " with a joining URI"), " (a recovery"), " (key")
			args := pastedArgs(t, line)
			if got := flagValue(args, "authority"); strings.HasPrefix(c.name, "untrusted, bound") && got != st.Authority {
				t.Errorf("%s: %s pasted gives --authority %q, want the state's %q", c.name, line, got, st.Authority)
			}
			if got := flagValue(args, "data"); got != string(dir) {
				t.Errorf("%s, directory %q: %s pasted gives --data %q", c.name, name, line, got)
			}
			// A bound-keypair join names the token (which is the node),
			// the others the node; status names neither.
			if strings.Contains(line, " join ") {
				if got := flagValue(args, "node") + flagValue(args, "bound-keypair"); got != "n1" && got != "n1n1" {
					t.Errorf("%s, directory %q: %s pasted gives --node/--bound-keypair %q", c.name, name, line, got)
				}
			}
		}
	}
}

// The agent's way out of an authority under a root it does not hold is
// added for its own verification's typed refusal, however wrapped, and
// not for an error that only reads like it.
func TestUntrustedAuthorityHintIsTyped(t *testing.T) {
	st, dir := &State{NodeID: "n1"}, Dir("/srv/agent")
	untrusted := &identity.UntrustedRootError{Err: errors.New("x509: certificate signed by unknown authority")}
	const hint = "does not chain to the roots in"
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"the refusal wrapped", fmt.Errorf("renew: %w", untrusted), true},
		{"a look-alike status", status.Error(codes.Unavailable, "connection error: "+untrusted.Error()), false},
		{"a look-alike error", errors.New(untrusted.Error()), false},
	} {
		if got := untrustedAuthorityHint(c.err, st, dir); strings.Contains(got.Error(), hint) != c.want {
			t.Errorf("%s: %v; want the hint %v", c.name, got, c.want)
		}
	}
}

// The way out of a root rotated while a bound-keypair agent was stopped
// pastes as printed: no sha256:… placeholder for the root to pin (which
// the agent cannot know: the root the authority presents did not verify),
// but the command that prints it on the authority and the variable the
// join reads it from.
func TestUntrustedBoundHintHasNoPlaceholder(t *testing.T) {
	dir := Dir(t.TempDir())
	st := &State{NodeID: "n1", BoundKeypair: "n1", JoinMethod: JoinMethodBoundKeypair, Authority: "127.0.0.1:7443"}
	got := untrustedAuthorityHint(&identity.UntrustedRootError{Err: errors.New("x509: certificate signed by unknown authority")}, st, dir).Error()
	for _, bad := range []string{"sha256:…", "--ca-fingerprint"} {
		if strings.Contains(got, bad) {
			t.Errorf("the hint holds %q, which does not paste: %s", bad, got)
		}
	}
	for _, want := range []string{"muster ca root status", EnvCAFingerprint, "muster agent join --force --data "} {
		if !strings.Contains(got, want) {
			t.Errorf("the hint lacks %q: %s", want, got)
		}
	}
}

// A bound-keypair agent's state from before the authority's address was
// recorded in it: the way out of a root it no longer trusts names the
// address agent.yaml kept from the join, else the discovery service that
// join went through, so it still pastes as printed; only with neither is
// there a placeholder, with where to read the address.
func TestUntrustedBoundHintWithoutTheStateAddress(t *testing.T) {
	untrusted := &identity.UntrustedRootError{Err: errors.New("x509: certificate signed by unknown authority")}
	st := &State{NodeID: "n1", BoundKeypair: "n1", JoinMethod: JoinMethodBoundKeypair, AuthorityID: "muster-1a2b3c"}
	for _, c := range []struct {
		name string
		cfg  Config
		want map[string]string
	}{
		{"agent.yaml's address", Config{Authority: "auth.example:7443"}, map[string]string{"authority": "auth.example:7443"}},
		{"through discovery", Config{Discovery: "disc.example:7450", DiscoveryFingerprint: "sha256:ab", AuthorityID: "muster-1a2b3c"},
			map[string]string{"discovery": "disc.example:7450", "discovery-fingerprint": "sha256:ab", "authority-id": "muster-1a2b3c"}},
	} {
		dir := Dir(t.TempDir())
		if err := dir.WriteConfig(c.cfg); err != nil {
			t.Fatal(err)
		}
		got := untrustedAuthorityHint(untrusted, st, dir).Error()
		if strings.Contains(got, "ADDR") {
			t.Errorf("%s: the hint holds the ADDR placeholder: %s", c.name, got)
		}
		m := regexp.MustCompile(`muster agent join .*? \(a recovery`).FindString(got)
		if m == "" {
			t.Fatalf("%s: no command in %s", c.name, got)
		}
		args := pastedArgs(t, strings.TrimSuffix(m, " (a recovery"))
		for flag, want := range c.want {
			if v := flagValue(args, flag); v != want {
				t.Errorf("%s: --%s %q pasted, want %q: %s", c.name, flag, v, want, m)
			}
		}
	}
	got := untrustedAuthorityHint(untrusted, st, Dir(t.TempDir())).Error()
	if !strings.Contains(got, "muster authority --data DIR --check-config") {
		t.Errorf("with no address anywhere, the hint does not say where to read it: %s", got)
	}
}
