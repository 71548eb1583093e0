package e2e

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// Socket activation: agent run started with a listening socket passed as
// systemd passes one (LISTEN_PID, LISTEN_FDS, the socket at fd 3) serves
// the Workload API on it and leaves it when it stops, so across a restart
// a client connects at once (queued by the kernel, never "no such file or
// directory") and gets its SVID as soon as the agent is back.
func TestWorkloadAPISocketActivation(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	adir := joinedAgent(t, e, "act-1")
	sock := filepath.Join(socketDir(t), "agent.sock")
	addr := "unix://" + sock
	// The test is systemd: it holds the socket for the whole test.
	passed := systemdSocket(t, sock)
	run := func() *proc {
		// LISTEN_PID must be the agent's own pid: the shell's, which
		// exec hands on.
		cmd := exec.Command("sh", "-c", `LISTEN_PID=$$ LISTEN_FDS=1 LISTEN_FDNAMES=muster-agent.socket exec "$0" "$@"`,
			musterBin, "agent", "run", "--data", adir, "--log-format", "json", "--workload-api", addr)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		cmd.ExtraFiles = []*os.File{passed}
		p, started := startCmd(t, "agent", "agent started", cmd)
		if started["workload_api"] != sock || started["workload_api_socket"] != "systemd" {
			t.Fatalf("agent started record: %v", started)
		}
		return p
	}
	p := run()

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	want := spiffeid.RequireFromPath(spiffeid.RequireTrustDomainFromString(e.authorityID), "/agent/act-1")
	first, err := workloadapi.FetchX509SVID(ctx, workloadapi.WithAddr(addr))
	if err != nil || first.ID != want {
		t.Fatalf("FetchX509SVID on the passed socket: %v %v\n%s", first, err, p.Logs())
	}
	// A watcher open across the restart.
	client, err := workloadapi.New(ctx, workloadapi.WithAddr(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	svids := make(x509Updates, 8)
	go client.WatchX509Context(ctx, svids)
	<-svids

	p.stop(t)
	down0 := time.Now()
	if fi, err := os.Lstat(sock); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("the agent stopping removed the passed socket: %v %v", fi, err)
	}
	// While the agent is down a caller connects (the kernel queues it),
	// and a go-spiffe fetch begun now waits rather than fails.
	down, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatalf("connecting while the agent restarts: %v", err)
	}
	defer down.Close()
	fetched := make(chan error, 1)
	go func() {
		s, err := workloadapi.FetchX509SVID(ctx, workloadapi.WithAddr(addr))
		if err == nil && s.ID != want {
			err = errWrongID(s.ID)
		}
		fetched <- err
	}()

	p = run()
	back := time.Now()
	// The connection made while the agent was down is served.
	conn, err := grpc.NewClient("passthrough:///agent", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return down, nil }))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := workload.NewSpiffeWorkloadAPIClient(conn).FetchX509SVID(
		metadata.AppendToOutgoingContext(ctx, "workload.spiffe.io", "true"), &workload.X509SVIDRequest{})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatalf("the connection made while the agent was down: %v\n%s", err, p.Logs())
	}
	if s, err := x509svid.ParseRaw(resp.Svids[0].X509Svid, resp.Svids[0].X509SvidKey); err != nil || s.ID != want {
		t.Fatalf("the SVID served on the connection made while the agent was down: %v %v", s, err)
	}
	t.Logf("connection made while the agent was down served %v after it was back", time.Since(back).Round(time.Millisecond))
	// gRPC gives a connection 20 s to answer, so on a machine slow
	// enough to keep the agent down that long the fetch ends UNAVAILABLE;
	// never, though, for want of the socket.
	switch err := <-fetched; {
	case err == nil:
		t.Logf("go-spiffe FetchX509SVID begun while the agent was down returned %v after it was back", time.Since(back).Round(time.Millisecond))
	case strings.Contains(err.Error(), "no such file") || strings.Contains(err.Error(), "connection refused"):
		t.Fatalf("go-spiffe FetchX509SVID begun while the agent was down found no socket: %v", err)
	default:
		t.Logf("go-spiffe FetchX509SVID begun while the agent was down: %v (the agent took %v to start)", err, time.Since(down0).Round(time.Millisecond))
	}
	select {
	case c := <-svids:
		if c.DefaultSVID().ID != want {
			t.Fatalf("the watcher's update after the restart: %v", c.DefaultSVID().ID)
		}
		t.Logf("go-spiffe watcher open across the restart updated %v after the agent was back", time.Since(back).Round(time.Millisecond))
	case <-ctx.Done():
		t.Fatalf("the watcher open across the restart got no SVID after it\n%s", p.Logs())
	}
}

type errWrongID spiffeid.ID

func (e errWrongID) Error() string { return "SVID of " + spiffeid.ID(e).String() }

// A socket passed at another path than --workload-api's is refused before
// the agent starts, naming the socket unit's setting that fixes it, and
// left in place; with no --workload-api the passed socket is served.
func TestWorkloadAPIPassedSocketChecked(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	adir := joinedAgent(t, e, "act-2")
	sock := filepath.Join(socketDir(t), "unit.sock")
	passed := systemdSocket(t, sock)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	agent := func(ctx context.Context, args ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, "sh", append([]string{"-c", `LISTEN_PID=$$ LISTEN_FDS=1 LISTEN_FDNAMES=muster-agent.socket exec "$0" "$@"`,
			musterBin, "agent", "run", "--data", adir, "--log-format", "json"}, args...)...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		cmd.ExtraFiles = []*os.File{passed}
		return cmd
	}

	other := filepath.Join(socketDir(t), "agent.sock")
	out, err := agent(ctx, "--workload-api", "unix://"+other).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "ListenStream="+other) || !strings.Contains(string(out), "--workload-api unix://"+sock) {
		t.Fatalf("a socket passed at %s, --workload-api at %s: %v\n%s", sock, other, err, out)
	}
	if _, err := os.Lstat(other); err == nil {
		t.Errorf("the refused agent made a socket of its own at %s", other)
	}
	if fi, err := os.Lstat(sock); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("the refused agent removed the passed socket: %v %v", fi, err)
	}

	_, started := startCmd(t, "agent", "agent started", agent(context.Background()))
	if started["workload_api"] != sock || started["workload_api_socket"] != "systemd" {
		t.Fatalf("no --workload-api, a socket passed: %v", started)
	}
	if s, err := workloadapi.FetchX509SVID(ctx, workloadapi.WithAddr("unix://"+sock)); err != nil || !strings.HasSuffix(s.ID.String(), "/agent/act-2") {
		t.Fatalf("FetchX509SVID on the passed socket: %v %v", s, err)
	}
}

// A token agent started after its certificate expired stops at once; on a
// socket passed by systemd, where a caller's connection was already
// waiting, it must not serve that caller the expired SVID meanwhile.
func TestWorkloadAPIExpiredAgentServesNothing(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t, "--agent-cert-ttl", "6s")
	adir := joinedAgent(t, e, "act-3")
	crt, err := os.ReadFile(filepath.Join(adir, "certs", "agent.crt"))
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(crt)
	if blk == nil {
		t.Fatal("certs/agent.crt holds no certificate")
	}
	time.Sleep(time.Until(mustParse(t, blk.Bytes).NotAfter.Add(time.Second)))

	sock := filepath.Join(socketDir(t), "agent.sock")
	passed := systemdSocket(t, sock)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The caller is waiting before the agent starts.
	waiting, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("passthrough:///agent", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return waiting, nil }))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	got := make(chan error, 1)
	go func() {
		// Any end without an SVID passes: the stream refused, or the
		// connection gone before the stream opened (gRPC then reconnects
		// through the dialer to the closed conn and says so).
		stream, err := workload.NewSpiffeWorkloadAPIClient(conn).FetchX509SVID(
			metadata.AppendToOutgoingContext(ctx, "workload.spiffe.io", "true"), &workload.X509SVIDRequest{})
		if err != nil {
			got <- nil
			return
		}
		resp, err := stream.Recv()
		if err != nil {
			got <- nil
			return
		}
		err = errors.New("served an SVID")
		if cs, perr := x509.ParseCertificates(resp.GetSvids()[0].GetX509Svid()); perr == nil && len(cs) > 0 {
			err = fmt.Errorf("served an SVID valid until %v", cs[0].NotAfter)
		}
		got <- err
	}()

	cmd := exec.CommandContext(ctx, "sh", "-c", `LISTEN_PID=$$ LISTEN_FDS=1 exec "$0" "$@"`,
		musterBin, "agent", "run", "--data", adir, "--workload-api", "unix://"+sock)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	cmd.ExtraFiles = []*os.File{passed}
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "expired") {
		t.Fatalf("agent run with an expired certificate: %v\n%s", err, out)
	}
	// The agent is gone: the caller's stream has ended, without an SVID.
	if err := <-got; err != nil {
		t.Fatalf("the caller waiting on the socket: %v\n%s", err, out)
	}
}

// systemdSocket listens on sock, as systemd does for a socket unit, and
// returns the listening socket as the file to pass the agent; both are
// closed at the test's end.
func systemdSocket(t *testing.T, sock string) *os.File {
	t.Helper()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	passed, err := l.File()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { passed.Close() })
	return passed
}
