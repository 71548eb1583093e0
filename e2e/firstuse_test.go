package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// First-use defects (issue 14, item 8): what a new user met on the way in.

// A second authority on a data directory refuses to start, naming the
// running one, instead of overwriting its authority.addr.
func TestSecondAuthorityOnADirectoryRefuses(t *testing.T) {
	dir, _ := initDir(t)
	a := startAuthority(t, dir)
	defer a.stop(t)
	line := mustFail(t, "authority", "--data", dir, "--listen", "127.0.0.1:0", "--metrics-listen", "")
	if want := fmt.Sprintf("(pid %d)", a.cmd.Process.Pid); !strings.Contains(line, "in use by another authority") || !strings.Contains(line, want) {
		t.Fatalf("second authority: %q, want it refused naming %s", line, want)
	}
	// The first one is still the one status reaches.
	mustRun(t, "status", "--data", dir)
}

// init and dev accept an existing empty directory, as systemd's
// StateDirectory= and Kubernetes volumes give, and init still refuses it
// once it holds an authority.
func TestInitAndDevOnAnEmptyDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "init", "--data", dir)
	if line := mustFail(t, "init", "--data", dir); !strings.Contains(line, "already holds an authority") {
		t.Fatalf("init on an initialised directory: %q", line)
	}

	devDir := filepath.Join(t.TempDir(), "dev")
	if err := os.Mkdir(devDir, 0o755); err != nil {
		t.Fatal(err)
	}
	devBanner(t, devDir, "--discovery-listen", "")
	mustRun(t, "status", "--data", devDir)
}

// devBanner starts muster dev on dir, returns what it printed up to the
// end of its banner, and leaves it running until the test ends.
func devBanner(t *testing.T, dir string, extra ...string) string {
	t.Helper()
	cmd := exec.Command(musterBin, append([]string{"dev", "--data", dir, "--listen", "127.0.0.1:0", "--metrics-listen", ""}, extra...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var out strings.Builder
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		out.WriteString(sc.Text() + "\n")
		if strings.HasPrefix(sc.Text(), "Stop with Ctrl-C") {
			return out.String()
		}
	}
	t.Fatalf("muster dev exited before its banner ended: %v\n%s", cmd.Wait(), out.String())
	return ""
}

// muster dev's banner does not tell the user to start the authority it
// runs, and its PSK step is one line and the command.
func TestDevBanner(t *testing.T) {
	out := devBanner(t, filepath.Join(t.TempDir(), "dev"), "--discovery-listen", "127.0.0.1:0")
	if strings.Contains(out, "muster authority") {
		t.Errorf("dev banner tells the user to start an authority:\n%s", out)
	}
	_, step5, ok := strings.Cut(out, "  5. ")
	if !ok {
		t.Fatalf("no PSK step in the banner:\n%s", out)
	}
	step5, _, _ = strings.Cut(step5, "\n\n")
	if lines := strings.Split(strings.TrimSpace(step5), "\n"); len(lines) != 2 || !strings.Contains(lines[1], "agent join") || !strings.Contains(lines[1], "--psk-file") {
		t.Errorf("PSK step is %d lines, want one line and the command:\n%s", len(lines), step5)
	}
}

// A not-found error names what is missing, not only "not found".
func TestNotFoundNamesTheMissingThing(t *testing.T) {
	dir, _ := initDir(t)
	a := startAuthority(t, dir)
	defer a.stop(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"token", "get", "zzzzzz"}, `NOT_FOUND: no join token "zzzzzz"`},
		{[]string{"token", "delete", "zzzzzz"}, `NOT_FOUND: no join token "zzzzzz"`},
		{[]string{"agents", "show", "ghost"}, `NOT_FOUND: no node "ghost"`},
		{[]string{"agents", "delete", "ghost"}, `NOT_FOUND: no node "ghost"`},
	} {
		if line := mustFail(t, append(c.args, "--data", dir)...); !strings.Contains(line, c.want) {
			t.Errorf("muster %s: %q, want %q", strings.Join(c.args, " "), line, c.want)
		}
	}
}

// Every delete command prints what it deleted with -o json.
func TestDeleteCommandsPrintJSON(t *testing.T) {
	e := newAgentEnv(t)
	tok := e.createToken(t)
	adir := filepath.Join(t.TempDir(), "agent")
	mustRun(t, "agent", "join", "--data", adir, "--node", "n1", tok.URI)
	mustRun(t, "lock", "create", "--node", "n2", "--data", e.dir)
	var locks []map[string]any
	json.Unmarshal([]byte(mustRun(t, "lock", "list", "--data", e.dir, "-o", "json")), &locks)
	if len(locks) != 1 {
		t.Fatalf("lock list = %v", locks)
	}
	lockID := locks[0]["id"].(string)
	for _, c := range []struct {
		args []string
		want map[string]any
	}{
		{[]string{"token", "delete", tok.ID}, map[string]any{"id": tok.ID, "deleted": true}},
		{[]string{"agents", "delete", "n1"}, map[string]any{"node_id": "n1", "deleted": true}},
		{[]string{"lock", "delete", lockID}, map[string]any{"id": lockID, "deleted": true}},
	} {
		out := mustRun(t, append(c.args, "--data", e.dir, "-o", "json")...)
		var got map[string]any
		if err := json.Unmarshal([]byte(out), &got); err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("muster %s -o json printed %q (%v), want %v", strings.Join(c.args, " "), out, err, c.want)
		}
	}
}

// Every path of the working directory the quick start tells the user to
// create is gitignored, like muster-data, so trying muster in a checkout
// leaves no secrets to commit.
func TestQuickStartPathsAreGitignored(t *testing.T) {
	cwd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	ignore, err := os.ReadFile(filepath.Join(filepath.Dir(cwd), ".gitignore"))
	if err != nil {
		t.Fatal(err)
	}
	ignored := map[string]bool{}
	for _, l := range strings.Split(string(ignore), "\n") {
		ignored[strings.Trim(strings.TrimSpace(l), "/")] = true
	}
	out := devBanner(t, filepath.Join(t.TempDir(), "dev"), "--discovery-listen", "127.0.0.1:0")
	paths := regexp.MustCompile(`(?:^|[\s(])\./([A-Za-z0-9._-]+)`).FindAllStringSubmatch(out, -1)
	if len(paths) < 2 {
		t.Fatalf("found %d ./paths in the banner:\n%s", len(paths), out)
	}
	for _, p := range append(paths, []string{"", "muster-data"}) {
		if !ignored[p[1]] {
			t.Errorf("the quick start's ./%s is not in .gitignore", p[1])
			ignored[p[1]] = true // once is enough
		}
	}
}

// A join without a CSR cannot be retried, as docs/operator-guide.md and
// the RPC's comment say: the repeat of a single-use token's join is
// refused, where the same join with a CSR gets its certificate again.
func TestJoinWithoutCSRIsNotRetrySafe(t *testing.T) {
	e := newJoinEnv(t)
	tok := e.token(t)
	req := &musterv1.ExchangeJoinTokenRequest{JoinToken: tok, NodeId: "keystore"}
	if _, err := e.boot.ExchangeJoinToken(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	_, err := e.boot.ExchangeJoinToken(t.Context(), req)
	wantCode(t, err, codes.FailedPrecondition, "no uses left")
}

// A token join pointed at a server that is not an authority (here the
// discovery service) says so, instead of "UNIMPLEMENTED: unknown service".
func TestTokenJoinAtANonAuthority(t *testing.T) {
	e := newAgentEnv(t)
	tok := e.createToken(t)
	disc := startDiscovery(t, filepath.Join(t.TempDir(), "discovery"))
	r := muster(t, []string{"MUSTER_JOIN_TOKEN=" + tok.Token}, "agent", "join", "--data", filepath.Join(t.TempDir(), "agent"),
		"--node", "n1", "--authority", disc.addr)
	if r.code == 0 || !strings.Contains(r.stderr, "is not a muster authority") {
		t.Fatalf("token join at the discovery service: exit %d, %s", r.code, r.stderr)
	}
}
