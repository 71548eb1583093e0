package cli

import (
	"strings"
	"testing"
)

// TestSeenStepsHelpSaysWhatTheBareFormGuards: activate, retire, rollback
// and ca rotate --activate guard what the operator saw only when named
// (VERSION --verifier-set-version N, --serial SERIAL); unnamed, the CLI
// reads the listing when it runs. The help once said "read just before",
// which an operator took for the listing they had read.
func TestSeenStepsHelpSaysWhatTheBareFormGuards(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"signer", "activate", "--help"}, "default: the version read when the command runs, which guards only against a step taken between that read and this one, not since you read the listing"},
		{[]string{"signer", "retire", "--help"}, "not since you read the listing"},
		{[]string{"signer", "rollback", "--help"}, "not since you read the listing"},
		{[]string{"signer", "activate", "--help"}, "muster signer activate v3-8b0e4a17 --verifier-set-version 12"},
		{[]string{"ca", "rotate", "--help"}, "not since you read the status"},
		{[]string{"ca", "rotate", "--help"}, "Without --serial, the command reads muster ca status when it runs"},
	} {
		code, stdout, stderr := runCLI(t, tt.args...)
		if code != 0 {
			t.Fatalf("%v: exit %d\n%s", tt.args, code, stderr)
		}
		if text := strings.Join(strings.Fields(stdout), " "); !strings.Contains(text, tt.want) {
			t.Errorf("%v printed:\n%s\nwant %q", tt.args, stdout, tt.want)
		}
		if strings.Contains(stdout, "read just before") {
			t.Errorf("%v still says \"read just before\":\n%s", tt.args, stdout)
		}
	}
}

// TestDiscoveryHelpNamesTheServingLock: discovery on a database it
// shares with an authority holds the serving lock, so muster store
// reapply refuses while it serves; its help once said nothing of it.
func TestDiscoveryHelpNamesTheServingLock(t *testing.T) {
	code, stdout, stderr := runCLI(t, "discovery", "--help")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	if want := "muster store reapply on that database refuses while it serves"; !strings.Contains(strings.Join(strings.Fields(stdout), " "), want) {
		t.Errorf("discovery --help printed:\n%s\nwant %q", stdout, want)
	}
}
