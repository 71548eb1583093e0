package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// guideTokenYAML is the token.yaml example of docs/operator-guide.md: the
// yaml block whose first line is "# token.yaml".
func guideTokenYAML(t *testing.T) string {
	t.Helper()
	guide, err := os.ReadFile(filepath.Join("..", "docs", "operator-guide.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(guide), "```yaml\n# token.yaml\n")
	if !ok {
		t.Fatal("docs/operator-guide.md has no yaml block starting \"# token.yaml\"")
	}
	block, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("the token.yaml block of docs/operator-guide.md does not end")
	}
	return block
}

// TestTokenYAMLRoundTrip: through the built binary, the operator guide's
// token.yaml applies as it is printed; token get -o yaml prints the
// resource (kind, metadata, spec, status) and token apply takes it back
// unchanged; an edit of it (a raised limit) applies; and a misspelt key is
// named with the keys valid there, not with a Go type.
func TestTokenYAMLRoundTrip(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	file := filepath.Join(t.TempDir(), "token.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	example := guideTokenYAML(t)
	write(example)
	if out := mustRun(t, "token", "apply", "-f", file, "--data", e.dir); !strings.Contains(out, "token build-runner-02 created (recovery limit 3, mode standard)") {
		t.Fatalf("token apply of the guide's example printed:\n%s", out)
	}

	got := mustRun(t, "token", "get", "build-runner-02", "--data", e.dir, "-o", "yaml")
	var res struct {
		Kind     string         `yaml:"kind"`
		Metadata map[string]any `yaml:"metadata"`
		Spec     map[string]any `yaml:"spec"`
		Status   struct {
			State        string         `yaml:"state"`
			BoundKeypair map[string]any `yaml:"bound_keypair"`
		} `yaml:"status"`
	}
	if err := yaml.Unmarshal([]byte(got), &res); err != nil {
		t.Fatalf("token get -o yaml: %v\n%s", err, got)
	}
	var want struct {
		Spec map[string]any `yaml:"spec"`
	}
	if err := yaml.Unmarshal([]byte(example), &want); err != nil {
		t.Fatal(err)
	}
	if res.Kind != "token" || res.Metadata["name"] != "build-runner-02" || res.Status.State == "" ||
		res.Status.BoundKeypair["bound_key_fingerprint"] != "SHA256:dpQucZ1gmMhD1QGLAsz/gqdSCHaQ8IybehyW9w9Hxvg" {
		t.Fatalf("token get -o yaml is not the resource:\n%s", got)
	}
	if !yamlEqual(t, res.Spec, want.Spec) {
		t.Fatalf("token get -o yaml's spec differs from the file applied:\n%s\napplied:\n%s", got, example)
	}

	// What get printed applies back, changing nothing.
	write(got)
	if out := mustRun(t, "token", "apply", "-f", file, "--data", e.dir); !strings.Contains(out, "token build-runner-02 updated") {
		t.Fatalf("token apply of token get -o yaml printed:\n%s", out)
	}
	if again := mustRun(t, "token", "get", "build-runner-02", "--data", e.dir, "-o", "yaml"); again != got {
		t.Fatalf("get → apply changed the token:\nbefore:\n%s\nafter:\n%s", got, again)
	}
	// An edit of it: the limit raised.
	write(strings.Replace(got, "limit: 3", "limit: 5", 1))
	mustRun(t, "token", "apply", "-f", file, "--data", e.dir)
	if after := mustRun(t, "token", "get", "build-runner-02", "--data", e.dir, "-o", "yaml"); !strings.Contains(after, "limit: 5") {
		t.Fatalf("the raised limit did not apply:\n%s", after)
	}

	write(strings.Replace(example, "limit: 3", "limt: 3", 1))
	msg := mustFail(t, "token", "apply", "-f", file, "--data", e.dir)
	if !strings.Contains(msg, `unknown field "spec.bound_keypair.recovery.limt"; valid here: limit, mode`) || strings.Contains(msg, "struct") {
		t.Fatalf("a misspelt key: %s", msg)
	}
}

// yamlEqual compares two decoded YAML values by their encoding.
func yamlEqual(t *testing.T, a, b any) bool {
	t.Helper()
	x, err := yaml.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := yaml.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return string(x) == string(y)
}
