package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A bound-keypair token made with bot add --svid-usage client,server gives
// its agent certificates that may serve TLS; token get -o yaml shows the
// usage and token apply changes it, which the agent's next refresh (agent
// renew) follows. bot add refuses --svid-usage server alone.
func TestBotSVIDUsage(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	if line := mustFail(t, "bot", "add", "bad", "--svid-usage", "server", "--data", e.dir); !strings.Contains(line, "INVALID_ARGUMENT") ||
		!strings.Contains(line, "client,server") {
		t.Errorf("bot add --svid-usage server: %q", line)
	}
	var reg botInfo
	if err := json.Unmarshal([]byte(mustRun(t, "bot", "add", "mesh", "--svid-usage", "client,server", "--data", e.dir, "-o", "json")), &reg); err != nil {
		t.Fatal(err)
	}
	adir := filepath.Join(t.TempDir(), "agent")
	mustRun(t, "agent", "join", "--data", adir, reg.URI)
	crt := filepath.Join(adir, "certs", "agent.crt")
	if !hasServerAuth(readCerts(t, crt)[0]) {
		t.Fatal("a bot added with --svid-usage client,server got a client-only certificate")
	}
	if got := mustRun(t, "token", "get", "mesh", "--data", e.dir); !strings.Contains(got, "client,server") {
		t.Errorf("token get does not show the usage:\n%s", got)
	}
	yaml := mustRun(t, "token", "get", "mesh", "--data", e.dir, "-o", "yaml")
	if !strings.Contains(yaml, "  svid_usage: client,server\n") {
		t.Fatalf("token get -o yaml lacks spec.svid_usage:\n%s", yaml)
	}
	file := filepath.Join(t.TempDir(), "token.yaml")
	if err := os.WriteFile(file, []byte(strings.Replace(yaml, "  svid_usage: client,server\n", "", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "token", "apply", "-f", file, "--data", e.dir)
	mustRun(t, "agent", "renew", "--data", adir)
	if hasServerAuth(readCerts(t, crt)[0]) {
		t.Fatal("the refresh after token apply took the usage away kept serverAuth")
	}
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "token", "apply", "-f", file, "--data", e.dir)
	mustRun(t, "agent", "renew", "--data", adir)
	if !hasServerAuth(readCerts(t, crt)[0]) {
		t.Fatal("the refresh after token apply gave client,server back has no serverAuth")
	}
}
