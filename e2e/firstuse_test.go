package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// First-use defects (issue 14, item 8): what a new user met on the way in.

// A second authority on a data directory refuses to start, naming the
// running one, instead of overwriting its authority.addr.
func TestSecondAuthorityOnADirectoryRefuses(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
	return devBannerEnv(t, dir, nil, extra...)
}

// devBannerEnv is devBanner with env added to dev's environment.
func devBannerEnv(t *testing.T, dir string, env []string, extra ...string) string {
	t.Helper()
	cmd := exec.Command(musterBin, append([]string{"dev", "--data", dir, "--listen", "127.0.0.1:0", "--metrics-listen", ""}, extra...)...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
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
	t.Parallel()
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

// A not-found error names what is missing, not only "not found", and the
// listing of what there is, with the flags that reached the authority,
// which works pasted (before, "no node" and "no join token" named none).
func TestNotFoundNamesTheMissingThing(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	a := startAuthority(t, dir)
	defer a.stop(t)
	for _, c := range []struct {
		args       []string
		want, list string
	}{
		{[]string{"token", "get", "zzzzzz"}, `NOT_FOUND: no join token "zzzzzz"`, "muster token list"},
		{[]string{"token", "delete", "zzzzzz"}, `NOT_FOUND: no join token "zzzzzz"`, "muster token list"},
		{[]string{"agents", "show", "ghost"}, `NOT_FOUND: no node "ghost"`, "muster agents list"},
		{[]string{"agents", "delete", "ghost"}, `NOT_FOUND: no node "ghost"`, "muster agents list"},
		{[]string{"lock", "delete", "lock-ghost"}, `NOT_FOUND: no lock "lock-ghost"`, "muster lock list"},
	} {
		line := mustFail(t, append(c.args, "--data", dir)...)
		if !strings.Contains(line, c.want) {
			t.Errorf("muster %s: %q, want %q", strings.Join(c.args, " "), line, c.want)
		}
		_, hint, ok := strings.Cut(line, "; ")
		_, cmd, ok2 := strings.Cut(hint, ": muster ")
		if !ok || !ok2 || !strings.HasPrefix("muster "+cmd, c.list+" --data ") {
			t.Errorf("muster %s: %q names no %s with --data", strings.Join(c.args, " "), line, c.list)
			continue
		}
		args := strings.Fields(cmd)
		if strings.Contains(cmd, "'") {
			t.Fatalf("the data directory needs no quoting here: %q", cmd)
		}
		mustRun(t, args...)
	}
}

// Every delete command prints what it deleted with -o json.
func TestDeleteCommandsPrintJSON(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
	e := newAgentEnv(t)
	tok := e.createToken(t)
	disc := startDiscovery(t, filepath.Join(t.TempDir(), "discovery"))
	r := muster(t, []string{"MUSTER_JOIN_TOKEN=" + tok.Token}, "agent", "join", "--data", filepath.Join(t.TempDir(), "agent"),
		"--node", "n1", "--authority", disc.addr)
	if r.code == 0 || !strings.Contains(r.stderr, "is not a muster authority") {
		t.Fatalf("token join at the discovery service: exit %d, %s", r.code, r.stderr)
	}
}

// lockedBuffer collects a process's output for a test to read meanwhile.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Every command muster dev's banner prints works pasted as it is, in the
// directory dev runs in (issue 25, item 15): the token, the join with its
// URI, agent run, the listings, and the PSK join through the embedded
// discovery. dev logs JSON where its standard error is not a terminal, as
// the authority and the agent do (startCmd waits for a JSON record).
func TestDevBannerStepsRunAsPrinted(t *testing.T) {
	t.Parallel()
	work := t.TempDir()
	cmd := exec.Command(musterBin, "dev", "--data", filepath.Join(work, "muster-data"), "--listen", "127.0.0.1:0",
		"--metrics-listen", "", "--discovery-listen", "127.0.0.1:0")
	cmd.Dir = work
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	var stdout lockedBuffer
	cmd.Stdout = &stdout
	startCmd(t, "muster dev", "authority started", cmd)
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(stdout.String(), "Stop with Ctrl-C") {
		if time.Now().After(deadline) {
			t.Fatalf("no end of the banner in 30s:\n%s", stdout.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, banner, _ := strings.Cut(stdout.String(), "In another terminal")
	var steps []string
	for _, l := range strings.Split(banner, "\n") {
		if strings.HasPrefix(l, "       ") {
			steps = append(steps, strings.TrimSpace(l))
		}
	}
	if len(steps) != 6 {
		t.Fatalf("%d commands in the banner, want 6:\n%s", len(steps), banner)
	}
	sh := func(line string) *exec.Cmd {
		c := exec.Command("sh", "-c", line)
		c.Dir, c.Env = work, []string{"PATH=" + os.Getenv("PATH"), "HOME=" + work}
		return c
	}
	var uri string
	for _, step := range steps {
		if uri != "" {
			step = strings.ReplaceAll(step, "'URI-FROM-STEP-1'", "'"+uri+"'")
		}
		if strings.Contains(step, "URI-FROM-STEP-1") {
			t.Fatalf("no URI from step 1 for %q", step)
		}
		if strings.Contains(step, " agent run ") {
			a, _ := startCmd(t, "agent run", "identity loaded", sh("exec "+step))
			a.stop(t)
			continue
		}
		out, err := sh(step).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", step, err, out)
		}
		if uri == "" {
			uri = regexp.MustCompile(`muster\+token://\S+`).FindString(string(out))
		}
	}
	for _, adir := range []string{"agent-data", "agent-psk"} {
		if _, err := os.Stat(filepath.Join(work, adir, "certs", "agent.crt")); err != nil {
			t.Errorf("no identity in ./%s after the banner's steps: %v", adir, err)
		}
	}
	nodes := mustRun(t, "agents", "list", "--data", filepath.Join(work, "muster-data"), "-o", "json")
	if !strings.Contains(nodes, `"my-node"`) || !strings.Contains(nodes, `"my-psk-node"`) {
		t.Errorf("agents list after the banner's steps: %s", nodes)
	}
}

// psk show --raw prints the active PSK alone, which --psk-file reads, and
// is refused beside -o.
func TestPSKShowRaw(t *testing.T) {
	t.Parallel()
	dir, init := initDir(t)
	a := startAuthority(t, dir)
	defer a.stop(t)
	if out := mustRun(t, "psk", "show", "--data", dir, "--raw"); out != init["bootstrap_psk"].(string)+"\n" {
		t.Errorf("psk show --raw = %q, want the PSK and a newline", out)
	}
	if line := mustFail(t, "psk", "show", "--data", dir, "--raw", "-o", "json"); !strings.Contains(line, "--raw") {
		t.Errorf("psk show --raw -o json: %q", line)
	}
}

// The agent's data directory is MUSTER_AGENT_DATA, not MUSTER_DATA (the
// authority's), and an agent refuses an authority's or a discovery
// service's directory however it is named (issue 25, item 16).
func TestAgentDataIsNotTheAuthoritys(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	tok := e.createToken(t)
	before := dirListing(t, e.dir)
	r := muster(t, []string{"MUSTER_DATA=" + e.dir}, "agent", "join", "--node", "n1", tok.URI)
	if r.code == 0 || !strings.Contains(r.stderr, "MUSTER_AGENT_DATA") {
		t.Errorf("agent join with MUSTER_DATA only: exit %d, %s", r.code, r.stderr)
	}
	r = muster(t, nil, "agent", "join", "--data", e.dir, "--node", "n1", tok.URI)
	if r.code == 0 || !strings.Contains(r.stderr, "is an authority's data directory") {
		t.Errorf("agent join --data AUTHORITY-DIR: exit %d, %s", r.code, r.stderr)
	}
	r = muster(t, []string{"MUSTER_AGENT_DATA=" + e.dir}, "agent", "status")
	if r.code == 0 || !strings.Contains(r.stderr, "is an authority's data directory") {
		t.Errorf("agent status with MUSTER_AGENT_DATA=AUTHORITY-DIR: exit %d, %s", r.code, r.stderr)
	}
	if after := dirListing(t, e.dir); after != before {
		t.Errorf("the agent wrote into the authority's directory:\nbefore %s\nafter  %s", before, after)
	}
	ddir := filepath.Join(t.TempDir(), "discovery")
	startDiscovery(t, ddir)
	r = muster(t, []string{"MUSTER_JOIN_URI=" + tok.URI, "MUSTER_NODE_ID=n1", "MUSTER_AGENT_DATA=" + ddir}, "agent", "run")
	if r.code == 0 || !strings.Contains(r.stderr, "is a discovery service's data directory") {
		t.Errorf("agent run with MUSTER_AGENT_DATA=DISCOVERY-DIR: exit %d, %s", r.code, r.stderr)
	}
	// Both exported, each command takes its own.
	adir := filepath.Join(t.TempDir(), "agent")
	r = muster(t, []string{"MUSTER_DATA=" + e.dir, "MUSTER_AGENT_DATA=" + adir}, "agent", "join", "--node", "n1", tok.URI)
	if r.code != 0 {
		t.Fatalf("agent join with both variables: exit %d, %s", r.code, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(adir, "certs", "agent.crt")); err != nil {
		t.Errorf("no identity in MUSTER_AGENT_DATA: %v", err)
	}
	mustRun(t, "agents", "show", "n1", "--data", e.dir)
}

// dirListing is every path under dir, for "nothing was written here".
func dirListing(t *testing.T, dir string) string {
	t.Helper()
	var paths []string
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		paths = append(paths, strings.TrimPrefix(p, dir))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(paths, " ")
}

// A second muster dev says one already runs — on its data directory (the
// lock's pid), or on its ports — instead of a bare "address already in
// use" (issue 25, item 19).
func TestSecondDevSaysOneRuns(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "dev")
	out := devBanner(t, dir, "--discovery-listen", "127.0.0.1:0")
	line := mustFail(t, "dev", "--data", dir, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--discovery-listen", "127.0.0.1:0")
	if !strings.Contains(line, "a muster dev (or authority) already runs on "+dir) || !strings.Contains(line, "Ctrl-C") || !strings.Contains(line, "kill ") {
		t.Errorf("second dev on the same directory: %q", line)
	}
	disc := regexp.MustCompile(`--discovery (\S+)`).FindStringSubmatch(out)
	if disc == nil {
		t.Fatalf("no discovery address in the banner:\n%s", out)
	}
	line = mustFail(t, "dev", "--data", filepath.Join(t.TempDir(), "other"), "--listen", "127.0.0.1:0", "--metrics-listen", "", "--discovery-listen", disc[1])
	if !strings.Contains(line, disc[1]) || !strings.Contains(line, "most likely a muster dev runs there") || !strings.Contains(line, "--discovery-listen") {
		t.Errorf("second dev on the first one's discovery port: %q", line)
	}
}

// Messages of the first steps (issue 25, item 19): the authority's port in
// use is said with one "authority:"; status of a build without a release
// version does not read "muster dev"; agents delete does not promise a
// new token to every node.
func TestFirstUseMessages(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	a := startAuthority(t, dir)
	defer a.stop(t)
	dir2, _ := initDir(t)
	line := mustFail(t, "authority", "--data", dir2, "--listen", a.listen, "--metrics-listen", "")
	if strings.Contains(line, "authority: authority:") || !strings.Contains(line, "cannot listen on "+a.listen) {
		t.Errorf("authority on a port in use: %q", line)
	}
	if out := mustRun(t, "status", "--data", dir); strings.Contains(out, "(muster dev,") {
		t.Errorf("status of a build without a version reads as muster dev:\n%s", out)
	}
	e := newAgentEnv(t)
	tok := e.createToken(t)
	mustRun(t, "agent", "join", "--data", filepath.Join(t.TempDir(), "agent"), "--node", "n1", tok.URI)
	if out := mustRun(t, "agents", "delete", "n1", "--data", e.dir); strings.Contains(out, "new token") || !strings.Contains(out, "Node n1 deleted") {
		t.Errorf("agents delete: %q", out)
	}
}

// The operator guide's agent unit is the one the Debian package installs
// (issue 25, item 17: the guide said DynamicUser=yes and
// Restart=on-failure, the package User=muster and Restart=on-abnormal), and
// it runs as its own user, not the authority's.
func TestGuideAgentUnitIsThePackagedOne(t *testing.T) {
	t.Parallel()
	unit, err := os.ReadFile("../packaging/systemd/muster-agent.service")
	if err != nil {
		t.Fatal(err)
	}
	guide, err := os.ReadFile("../docs/operator-guide.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(guide), "### Running the agent with systemd")
	if !ok {
		t.Fatal("no systemd section in the operator guide")
	}
	_, block, ok := strings.Cut(sec, "```ini\n")
	block, _, _ = strings.Cut(block, "```")
	if !ok || block != string(unit) {
		t.Errorf("the guide's agent unit differs from packaging/systemd/muster-agent.service:\n%s", block)
	}
	sock, err := os.ReadFile("../packaging/systemd/muster-agent.socket")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, _ = strings.Cut(sec, "```ini\n")
	_, block, ok = strings.Cut(sec, "```ini\n")
	block, _, _ = strings.Cut(block, "```")
	if !ok || block != string(sock) {
		t.Errorf("the guide's agent socket unit differs from packaging/systemd/muster-agent.socket:\n%s", block)
	}
	for _, want := range []string{"\nUser=muster-agent\n", "\nGroup=muster-agent\n", "\nRestart=on-abnormal\n"} {
		if !strings.Contains(string(unit), want) {
			t.Errorf("the agent unit lacks %q", strings.TrimSpace(want))
		}
	}
	auth, err := os.ReadFile("../packaging/systemd/muster-authority.service")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(auth), "\nUser=muster\n") {
		t.Error("the authority unit does not run as muster")
	}
}
