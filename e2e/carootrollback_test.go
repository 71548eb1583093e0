package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/identity"
)

// TestRootRotationRollbackUnderAgents*: for each phase P of init,
// update_agents and update_servers, a root rotation is advanced to P with
// one agent running and one stopped (since just before P), then rolled
// back one phase. Afterwards the running agent renews with no refused
// renewal, the stopped agent started again renews by itself (no join, no
// operator action), both agents' certs/ca.crt holds exactly the roots the
// authority trusts now and certs/bundle.pem starts with them, each leaf
// verifies with openssl against its own files, and a PSK join pinned to
// the old root's fingerprint works. Certificates last two minutes, so
// the running agent renews in update_servers (to a leaf under the new
// root) and again after the rollback (under the old one). One authority
// per phase, each phase its own test, so that the three run in parallel.
// (As parallel subtests they waited for a slot behind every top-level
// test already queued, and the longest, update_servers at two minutes,
// started about 170 s into the parallel phase and ended the package's
// run about 50 s after every other test.)
func TestRootRotationRollbackUnderAgentsFromInit(t *testing.T) {
	t.Parallel()
	rollbackFrom(t, "init")
}

func TestRootRotationRollbackUnderAgentsFromUpdateAgents(t *testing.T) {
	t.Parallel()
	rollbackFrom(t, "update_agents")
}

func TestRootRotationRollbackUnderAgentsFromUpdateServers(t *testing.T) {
	t.Parallel()
	rollbackFrom(t, "update_servers")
}

func rollbackFrom(t *testing.T, phase string) {
	dir, init := initDir(t)
	e := &agentEnv{dir: dir, auth: startAuthority(t, dir, "--agent-cert-ttl", "2m")}
	e.authorityID, _ = init["authority_id"].(string)
	e.fingerprint, _ = init["ca_fingerprint"].(string)
	psk := init["bootstrap_psk"].(string)
	oldFP := e.fingerprint

	ra := startRotationAgents(t, e, "rb")
	dirs, serial, chainsTo, rootsOf := ra.dirs, ra.serial, ra.chainsTo, ra.rootsOf
	// bundleRoots: the self-signed certificates of bundle.pem.
	bundleRoots := func(i int) []string {
		b, _ := os.ReadFile(filepath.Join(dirs[i], "certs", "bundle.pem"))
		certs, _ := ca.ParseCertsPEM(b)
		var fps []string
		for _, c := range certs {
			if identity.IsRoot(c) {
				fps = append(fps, ca.Fingerprint(c))
			}
		}
		slices.Sort(fps)
		return fps
	}
	// stopFresh stops agent-1 after renewing it, so its certificate
	// (two minutes) outlasts its time offline.
	stopFresh := func() {
		ra.procs[1].stop(t)
		mustRun(t, "agent", "renew", "--data", dirs[1])
	}

	// Advance to the phase with agent-1 stopped since just before it.
	if phase == "init" {
		stopFresh()
	}
	st := caRoot(t, dir, "rotate")
	newFP := st.NewRoot.Fingerprint
	newRoot := pemFile(t, "new-root.pem", st.NewRoot.PEM)
	waitFor(t, agentReach, "agent-0 takes the new root in init", func() bool { return len(rootsOf(0)) == 2 })
	if phase != "init" {
		waitFor(t, agentReach, "agent-1 takes the new root in init", func() bool { return len(rootsOf(1)) == 2 })
		if phase == "update_agents" {
			stopFresh()
		}
		if st = caRoot(t, dir, "next-phase"); st.Phase != "update_agents" {
			t.Fatalf("next-phase from init: %+v", st)
		}
	}
	if phase == "update_servers" {
		stopFresh()
		if st = caRoot(t, dir, "next-phase"); st.Phase != "update_servers" {
			t.Fatalf("next-phase from update_agents: %+v", st)
		}
		// The running agent renews in update_servers, to a leaf under
		// the new root.
		before := serial(0)
		waitFor(t, 100*time.Second, "agent-0 renewed to a leaf under the new root in update_servers", func() bool {
			return serial(0) != before && chainsTo(0, newRoot)
		})
	} else {
		time.Sleep(2 * time.Second)
	}

	// Roll back one phase; agent-1 comes back.
	st = caRoot(t, dir, "rollback")
	want := map[string]string{"init": "none", "update_agents": "init", "update_servers": "update_agents"}[phase]
	if st.Phase != want {
		t.Fatalf("rollback from %s: phase %s, want %s", phase, st.Phase, want)
	}
	var trusted []string
	for _, r := range st.TrustedRoots {
		trusted = append(trusted, r.Fingerprint)
	}
	slices.Sort(trusted)
	if !slices.Contains(trusted, oldFP) {
		t.Fatalf("after the rollback from %s the old root is not trusted: %v", phase, trusted)
	}
	before := [2]string{serial(0), serial(1)}
	ra.start(1, nil)

	for i := range dirs {
		waitFor(t, 100*time.Second, fmt.Sprintf("agent-%d renewed after the rollback", i), func() bool { return serial(i) != before[i] })
		waitFor(t, agentReach, fmt.Sprintf("agent-%d holds the authority's roots %v", i, trusted), func() bool {
			return slices.Equal(rootsOf(i), trusted) && slices.Equal(bundleRoots(i), trusted)
		})
		if out, ok := ra.verify(i, filepath.Join(dirs[i], "certs", "ca.crt")); !ok {
			t.Errorf("agent-%d: openssl verify of its leaf against its ca.crt and bundle.pem:\n%s", i, out)
		}
	}
	if phase == "update_servers" {
		// The intermediates are under the old root again.
		oldRoot := pemFile(t, "old-root.pem", st.OldRoot.PEM)
		for i := range dirs {
			if !chainsTo(i, oldRoot) {
				t.Errorf("agent-%d renewed after the rollback to update_agents to a leaf not under the old root", i)
			}
		}
	}

	adir := filepath.Join(t.TempDir(), "late")
	if r := pskJoin(t, e, adir, "late", psk, oldFP); r.code != 0 {
		t.Errorf("after the rollback from %s: a join pinned to the old root: exit %d\n%s", phase, r.code, r.stderr)
	}
	if phase != "init" {
		adir := filepath.Join(t.TempDir(), "late-new")
		if r := pskJoin(t, e, adir, "late-new", psk, newFP); r.code != 0 {
			t.Errorf("after the rollback from %s: a join pinned to the new root: exit %d\n%s", phase, r.code, r.stderr)
		}
	}

	ra.stopCheckingNoFailure(t, "around the rollback from "+phase)
}
