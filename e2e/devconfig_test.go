package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// muster dev honours DIR/authority.yaml as muster authority does: a
// setting in it is used, refused with its name, or (dev's own listen
// addresses) said to be unused; never silently ignored.
func TestDevHonoursAuthorityYAML(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	writeConfig := func(yaml string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, "authority.yaml"), []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	devArgs := []string{"dev", "--data", dir, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--log-format", "json"}

	for _, c := range []struct{ name, yaml, want string }{
		{"embedded discovery beside another", "discovery:\n  address: 127.0.0.1:1\n", `discovery.address 127.0.0.1:1 in`},
		{"bad value", "limits:\n  call_timeout: 1ms\n", `limits.call_timeout "1ms"`},
		{"bad signer lead", "signer:\n  min_lead_time: 1s\n", `signer.min_lead_time "1s"`},
	} {
		writeConfig(c.yaml)
		if line := mustFail(t, append(devArgs, "--discovery-listen", "127.0.0.1:0")...); !strings.Contains(line, c.want) {
			t.Errorf("%s: muster dev said %q, want %q", c.name, line, c.want)
		}
	}

	writeConfig("listen: 0.0.0.0:9\nsigner:\n  min_lead_time: 1m\n")
	p, _ := startProc(t, "muster dev", "authority started", append(devArgs, "--discovery-listen", "")...)
	if !strings.Contains(p.Logs(), "dev: listen 0.0.0.0:9 in "+filepath.Join(dir, "authority.yaml")+" is not used") {
		t.Errorf("dev did not say it keeps its own listen address:\n%s", p.Logs())
	}
	if out := mustRun(t, "signer", "list", "--data", dir); !strings.Contains(out, "minimum lead time 1m0s") {
		t.Errorf("signer list under dev with signer.min_lead_time: 1m:\n%s", out)
	}
	p.stop(t)

	// Shared settings (kept in the store) changed in the file take
	// effect at the next start on the same directory: dev's SQLite store
	// has one authority, whose settings are the store's.
	writeConfig("signer:\n  min_lead_time: 3m\nca:\n  intermediate_ttl: 4380h\n")
	p, _ = startProc(t, "muster dev", "authority started", append(devArgs, "--discovery-listen", "")...)
	defer p.stop(t)
	if out := mustRun(t, "signer", "list", "--data", dir); !strings.Contains(out, "minimum lead time 3m0s") {
		t.Errorf("signer list under dev restarted with signer.min_lead_time: 3m:\n%s", out)
	}
	if s := settingsOf(t, "--data", dir)["ca.intermediate_ttl"]; s.Value != "4380h0m0s" {
		t.Errorf("settings list under dev restarted with ca.intermediate_ttl: 4380h: %+v", s)
	}
}

// What muster dev prints about deploying agents is true and pasteable:
// no placeholder for an address dev knows, and the environment block,
// pasted in one shell, joins an agent with the PSK alone (with dev's
// discovery, through it, which issues the referral ticket the PSK join
// needs; without, at the authority's address).
func TestDevAgentEnvJoins(t *testing.T) {
	t.Parallel()
	for _, disc := range []string{"127.0.0.1:0", ""} {
		work := t.TempDir()
		cmd := exec.Command(musterBin, "dev", "--data", filepath.Join(work, "muster-data"), "--listen", "127.0.0.1:0",
			"--metrics-listen", "", "--discovery-listen", disc)
		cmd.Dir = work
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		var stdout lockedBuffer
		cmd.Stdout = &stdout
		p, _ := startCmd(t, "muster dev", "authority started", cmd)
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(stdout.String(), "Stop with Ctrl-C") {
			if time.Now().After(deadline) {
				t.Fatalf("no end of the banner in 30s:\n%s", stdout.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
		out := stdout.String()
		if strings.Contains(out, "=<") {
			t.Errorf("--discovery-listen %q: dev prints a placeholder for a value it knows:\n%s", disc, out)
		}
		_, block, ok := strings.Cut(out, "the last line joins ./agent-env:\n")
		block, _, _ = strings.Cut(block, "\n\n")
		if !ok || !strings.Contains(block, "export MUSTER_BOOTSTRAP_PSK=") {
			t.Fatalf("--discovery-listen %q: no environment block for agents:\n%s", disc, out)
		}
		sh := exec.Command("sh", "-ec", block)
		sh.Dir, sh.Env = work, []string{"PATH=" + os.Getenv("PATH"), "HOME=" + work}
		if b, err := sh.CombinedOutput(); err != nil {
			t.Fatalf("--discovery-listen %q: the environment block failed: %v\n%s\n%s", disc, err, block, b)
		}
		if _, err := os.Stat(filepath.Join(work, "agent-env", "certs", "agent.crt")); err != nil {
			t.Errorf("--discovery-listen %q: no identity in ./agent-env after the environment block: %v", disc, err)
		}
		p.stop(t)
	}
}
