package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// muster dev gives agent certificates the lifetime muster authority would:
// from --agent-cert-ttl, MUSTER_AGENT_CERT_TTL or agent_cert_ttl in
// DIR/authority.yaml (it ignored all three, and always gave 24h), and
// refuses one above the ceiling before it starts.
func TestDevAgentCertTTL(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		env  []string
		args []string
		file string
		want time.Duration
	}{
		{"flag", nil, []string{"--agent-cert-ttl", "2h"}, "", 2 * time.Hour},
		{"variable", []string{"MUSTER_AGENT_CERT_TTL=3h"}, nil, "", 3 * time.Hour},
		{"settings file", nil, nil, "agent_cert_ttl: 90m\n", 90 * time.Minute},
		{"flag over settings file", nil, []string{"--agent-cert-ttl", "45m"}, "agent_cert_ttl: 90m\n", 45 * time.Minute},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join(t.TempDir(), "dev")
			if c.file != "" {
				dir, _ = initDir(t)
				if err := os.WriteFile(filepath.Join(dir, "authority.yaml"), []byte(c.file), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			devBannerEnv(t, dir, c.env, append(c.args, "--discovery-listen", "")...)
			var tok createdToken
			if err := json.Unmarshal([]byte(mustRun(t, "token", "create", "--data", dir, "-o", "json")), &tok); err != nil {
				t.Fatal(err)
			}
			adir := filepath.Join(t.TempDir(), "agent")
			mustRun(t, "agent", "join", "--data", adir, "--node", "dev-ttl", tok.URI)
			leaf := readCert(t, filepath.Join(adir, "certs", "agent.crt"))
			// NotBefore is backdated a minute for clock skew.
			if got := leaf.NotAfter.Sub(leaf.NotBefore); got < c.want || got > c.want+2*time.Minute {
				t.Fatalf("agent certificate lives %s, want %s (and the minute of backdating)", got, c.want)
			}
		})
	}
	t.Run("above the ceiling", func(t *testing.T) {
		t.Parallel()
		line := mustFail(t, "dev", "--data", filepath.Join(t.TempDir(), "dev"), "--listen", "127.0.0.1:0", "--metrics-listen", "",
			"--discovery-listen", "", "--agent-cert-ttl", "200h")
		if want := `dev: agent_cert_ttl "200h": want a duration of at most 168h, such as 24h`; !strings.Contains(line, want) {
			t.Fatalf("dev --agent-cert-ttl 200h: %q, want %q", line, want)
		}
	})
}
