package e2e

import (
	"encoding/json"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// completions runs cobra's hidden __complete command, as a shell does at
// TAB, and returns the candidates and the directive line.
func completions(t *testing.T, args ...string) ([]string, string) {
	t.Helper()
	r := muster(t, nil, append([]string{"__complete"}, args...)...)
	if r.code != 0 {
		t.Fatalf("__complete %v: exit %d\n%s", args, r.code, r.stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	directive := lines[len(lines)-1]
	var got []string
	for _, l := range lines[:len(lines)-1] {
		got = append(got, strings.SplitN(l, "\t", 2)[0])
	}
	slices.Sort(got)
	return got, directive
}

// Node IDs, token IDs and lock IDs complete from the running authority,
// with the operator identity the data directory holds, filtered by what
// was typed; with no authority to ask, nothing completes and nothing is
// printed for the shell to show.
func TestShellCompletionFromTheAuthority(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	tok := e.createToken(t)
	tok2 := e.createToken(t)
	for _, node := range []string{"web-1", "web-2", "db-1"} {
		adir := filepath.Join(t.TempDir(), node)
		mustRun(t, "agent", "join", "--data", adir, "--node", node, e.createToken(t).URI)
	}
	lockOut := mustRun(t, "lock", "create", "--data", e.dir, "--node", "db-1", "-o", "json")
	lockID := jsonField(t, lockOut, "id")

	// The ShellCompDirectiveNoFileComp directive: never fall back to files.
	const noFiles = ":4"
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"agents show", []string{"agents", "show", "--data", e.dir, ""}, []string{"db-1", "web-1", "web-2"}},
		{"agents show prefix", []string{"agents", "show", "--data", e.dir, "web"}, []string{"web-1", "web-2"}},
		{"agents delete", []string{"agents", "delete", "--data", e.dir, "d"}, []string{"db-1"}},
		{"agents show second argument", []string{"agents", "show", "--data", e.dir, "web-1", ""}, nil},
		{"token get", []string{"token", "get", "--data", e.dir, tok.ID}, []string{tok.ID}},
		{"token delete", []string{"token", "delete", "--data", e.dir, tok2.ID[:len(tok2.ID)-1]}, []string{tok2.ID}},
		{"lock delete", []string{"lock", "delete", "--data", e.dir, ""}, []string{lockID}},
		{"lock create --node", []string{"lock", "create", "--data", e.dir, "--node", "web-"}, []string{"web-1", "web-2"}},
		{"lock create --token", []string{"lock", "create", "--data", e.dir, "--token", tok.ID}, []string{tok.ID}},
		{"task send --node", []string{"task", "send", "--data", e.dir, "--type", "node.report", "--node", "db"}, []string{"db-1"}},
		{"no match", []string{"agents", "show", "--data", e.dir, "zzz"}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, directive := completions(t, c.args...)
			if !reflect.DeepEqual(got, c.want) || directive != noFiles {
				t.Fatalf("completions %v, directive %s; want %v, %s", got, directive, c.want, noFiles)
			}
		})
	}

	// No authority: an empty data directory has no operator identity.
	empty := t.TempDir()
	r := muster(t, nil, "__complete", "agents", "show", "--data", empty, "")
	if strings.TrimSpace(r.stdout) != noFiles || r.code != 0 {
		t.Fatalf("completion without an authority printed %q (exit %d), want only the directive", r.stdout, r.code)
	}
	if strings.Contains(r.stderr, "operator") || strings.Contains(r.stderr, "muster:") {
		t.Fatalf("completion without an authority printed an error: %q", r.stderr)
	}
}

// jsonField is one string field of a JSON object a command printed.
func jsonField(t *testing.T, out, field string) string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("%q: %v", out, err)
	}
	s, _ := m[field].(string)
	if s == "" {
		t.Fatalf("no %s in %s", field, out)
	}
	return s
}
