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
	cmd := exec.Command("sh", "-c", line)
	cmd.Env = []string{"PATH=" + bin + ":/usr/bin:/bin", "MUSTER_ARGS_OUT=" + out}
	if msg, err := cmd.CombinedOutput(); err != nil {
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
				regexp.MustCompile(`muster agent join .*? \(the root`)},
		} {
			m := c.cmd.FindString(c.err.Error())
			if m == "" {
				t.Fatalf("%s: no command in %v", c.name, c.err)
			}
			line := strings.TrimSuffix(strings.TrimSuffix(m, " with a joining URI"), " (the root")
			args := pastedArgs(t, line)
			if got := flagValue(args, "authority"); strings.HasPrefix(c.name, "untrusted, bound") && got != st.Authority {
				t.Errorf("%s: %s pasted gives --authority %q, want the state's %q", c.name, line, got, st.Authority)
			}
			if got := flagValue(args, "data"); got != string(dir) {
				t.Errorf("%s, directory %q: %s pasted gives --data %q", c.name, name, line, got)
			}
			if got := flagValue(args, "node"); got != "n1" {
				t.Errorf("%s, directory %q: %s pasted gives --node %q", c.name, name, line, got)
			}
		}
	}
	if _, err := os.Stat("pwned"); err == nil {
		os.Remove("pwned")
		t.Error("a pasted hint ran the command substitution in its directory's name")
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
