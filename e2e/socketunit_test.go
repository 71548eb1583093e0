package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/workloadapi"
)

// unitSettings reads KEY=VALUE lines of a packaged systemd unit.
func unitSettings(t *testing.T, unit string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "packaging", "systemd", unit))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, l := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(l), "="); ok && !strings.HasPrefix(l, "#") {
			m[k] = v
		}
	}
	return m
}

// The packaged socket unit and agent service, run by systemd's own
// socket activation (systemd-socket-activate, from the systemd package,
// the tool systemd documents for testing socket-activated services): it
// listens as muster-agent.socket does, at the unit's socket name and with
// its SocketMode, and starts the service's ExecStart at the first
// caller's connection, passing the socket as systemd does (LISTEN_PID,
// LISTEN_FDS, LISTEN_FDNAMES). The first caller is answered with the
// node's SVID: the agent, told no --workload-api (as packaged), takes
// the passed socket, logs no Workload API warning, and leaves the socket
// when it stops.
func TestWorkloadAPIUnderSystemdSocketActivate(t *testing.T) {
	t.Parallel()
	activate, err := exec.LookPath("systemd-socket-activate")
	if err != nil {
		skipUnlessRequired(t, "MUSTER_REQUIRE_SYSTEMD", "no systemd-socket-activate (apt systemd): %v", err)
	}
	sockUnit := unitSettings(t, "muster-agent.socket")
	service := unitSettings(t, "muster-agent.service")
	mode, err := strconv.ParseUint(sockUnit["SocketMode"], 8, 32)
	if err != nil || sockUnit["ListenStream"] == "" || sockUnit["Service"] != "muster-agent.service" {
		t.Fatalf("muster-agent.socket: ListenStream=%q SocketMode=%q Service=%q", sockUnit["ListenStream"], sockUnit["SocketMode"], sockUnit["Service"])
	}
	// The service's command, with this test's binary, data directory and
	// metrics port.
	args := strings.Fields(service["ExecStart"])
	if len(args) < 3 || args[0] != "/usr/bin/muster" || args[1] != "agent" || args[2] != "run" {
		t.Fatalf("muster-agent.service ExecStart=%s", service["ExecStart"])
	}
	e := newAgentEnv(t)
	adir := joinedAgent(t, e, "unit-1")
	for i := 3; i+1 < len(args); i++ {
		switch args[i] {
		case "--data":
			args[i+1] = adir
		case "--metrics-listen":
			args[i+1] = "127.0.0.1:0"
		case "--workload-api":
			t.Fatalf("muster-agent.service names --workload-api %s: the packaged agent takes the socket unit's", args[i+1])
		}
	}
	args[0] = musterBin
	// The unit's socket, in a directory of the test (/run/muster is the
	// machine's); the agent takes the passed socket wherever it is.
	sock := filepath.Join(socketDir(t), filepath.Base(sockUnit["ListenStream"]))
	// No FileDescriptorName=: systemd names the socket after its unit.
	cmd := exec.Command(activate, append([]string{"--listen=" + sock, "--fdname=muster-agent.socket"}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "MUSTER_LOG_FORMAT=json"}

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	type fetched struct {
		id  string
		err error
	}
	first := make(chan fetched, 1)
	go func() {
		// systemd-socket-activate has no SocketMode=: give the socket the
		// unit's once it listens, before the first caller starts the agent.
		for {
			if fi, err := os.Lstat(sock); err == nil && fi.Mode().Type() == os.ModeSocket {
				break
			}
			select {
			case <-ctx.Done():
				first <- fetched{err: ctx.Err()}
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
		if err := os.Chmod(sock, os.FileMode(mode)); err != nil {
			first <- fetched{err: err}
			return
		}
		s, err := workloadapi.FetchX509SVID(ctx, workloadapi.WithAddr("unix://"+sock))
		if err != nil {
			first <- fetched{err: err}
			return
		}
		first <- fetched{id: s.ID.String()}
	}()
	p, started := startCmd(t, "agent under systemd-socket-activate", "agent started", cmd)
	if started["workload_api"] != sock || started["workload_api_socket"] != "systemd" {
		t.Fatalf("agent started record: %v", started)
	}
	f := <-first
	if f.err != nil || !strings.HasSuffix(f.id, "/agent/unit-1") {
		t.Fatalf("the caller whose connection started the agent: %q %v\n%s", f.id, f.err, p.Logs())
	}
	fi, err := os.Lstat(sock)
	if err != nil || fi.Mode().Perm() != os.FileMode(mode) {
		t.Fatalf("the socket after the start: %v %v", fi, err)
	}
	p.stop(t)
	// The socket is systemd's: the agent leaves it.
	if fi, err := os.Lstat(sock); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("the agent stopping removed the socket unit's socket: %v %v", fi, err)
	}
	for _, l := range strings.Split(p.Logs(), "\n") {
		if strings.Contains(l, `"level":"WARN"`) && strings.Contains(l, "workload api:") {
			t.Errorf("the agent warned with the unit's settings: %s", l)
		}
	}
}
