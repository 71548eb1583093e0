package e2e

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRootNextPhaseDoesNotHoldStop: SIGTERM while `muster ca root
// next-phase` waits for the leader to move the intermediates under the new
// root (update_agents -> update_servers) stops the authority within its
// grace, not cut short, and the command gets its answer. The leader steps
// down as the stop begins, so the wait could only end at the stop's 10 s
// grace: that long the api listener, closed to new connections, renewed
// no agent (an agent whose certificate ran out meanwhile stopped for
// good). Started again, the authority's leader moves the intermediates.
func TestRootNextPhaseDoesNotHoldStop(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	auth := startAuthority(t, dir)
	caRoot(t, dir, "rotate")
	if st := caRoot(t, dir, "next-phase"); st.Phase != "update_agents" {
		t.Fatalf("after the first next-phase: phase %q, want update_agents", st.Phase)
	}

	type answer struct {
		out []byte
		err error
	}
	answered := make(chan answer, 1)
	home := t.TempDir()
	go func() {
		cmd := exec.Command(musterBin, "ca", "root", "next-phase", "--data", dir, "-o", "json")
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home}
		out, err := cmd.CombinedOutput()
		answered <- answer{out, err}
	}()
	// The successors become active only after their 10 s publish window,
	// so the command is still waiting when the phase change is logged.
	waitFor(t, 30*time.Second, "the phase change to update_servers in the authority's log", func() bool {
		return strings.Contains(auth.Logs(), `"to":"update_servers"`)
	})
	auth.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-auth.done:
		if auth.exitErr != nil {
			t.Fatalf("the authority exited with %v after SIGTERM", auth.exitErr)
		}
	case <-time.After(30 * time.Second):
		auth.cmd.Process.Kill()
		t.Fatal("the authority did not stop within 30 s of SIGTERM")
	}
	if l := grepLines(auth.Logs(), "were cut short"); l != "" {
		t.Errorf("the stop waited on next-phase's wait for a leader that had stepped down, until its grace cut the call:\n%s", l)
	}
	select {
	case a := <-answered:
		if a.err != nil || !strings.Contains(string(a.out), `"phase": "update_servers"`) {
			t.Errorf("next-phase during the stop: %v\n%s\nwant its answer, phase update_servers", a.err, a.out)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("next-phase did not return within 60 s of the authority's stop")
	}

	// The phase was written: the leader of the authority started again
	// moves every intermediate (bootstrap, server, agent, admin).
	again := startAuthority(t, dir)
	waitFor(t, 60*time.Second, "the four intermediates activated under the new root after the restart", func() bool {
		return strings.Count(grepLines(again.Logs(), `"action":"ca.activate"`), "root rotation") >= 4
	})
}
