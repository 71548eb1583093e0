package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	defer p.stop(t)
	if !strings.Contains(p.Logs(), "dev: listen 0.0.0.0:9 in "+filepath.Join(dir, "authority.yaml")+" is not used") {
		t.Errorf("dev did not say it keeps its own listen address:\n%s", p.Logs())
	}
	if out := mustRun(t, "signer", "list", "--data", dir); !strings.Contains(out, "minimum lead time 1m0s") {
		t.Errorf("signer list under dev with signer.min_lead_time: 1m:\n%s", out)
	}
}
