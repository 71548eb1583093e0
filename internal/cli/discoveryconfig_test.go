package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDiscoverySettings: like the authority's, discovery's settings come
// from DIR/discovery.yaml or --config, under MUSTER_* variables and flags;
// --check-config prints them, creates nothing and names a bad setting.
func TestDiscoverySettings(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "disc")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	fp := "sha256:" + strings.Repeat("ab", 32)
	write := func(path, body string) string {
		t.Helper()
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	write(filepath.Join(dir, "discovery.yaml"), "listen: 127.0.0.1:1001\nkey_rotation: 48h\nallowed_authorities:\n  - {authority_id: prod-ababab, ca_fingerprint: \""+fp+"\"}\n")
	other := write(filepath.Join(t.TempDir(), "other.yaml"), "listen: 127.0.0.1:1002\nstore: postgres://d:secret@db.internal/disc\n")
	fresh := filepath.Join(t.TempDir(), "not-yet")
	limits := write(filepath.Join(t.TempDir(), "limits.yaml"), "limits:\n  max_calls_per_source: 64\n  call_timeout: 2m\n")
	relative := write(filepath.Join(t.TempDir(), "relative.yaml"), "store: sqlite://db/disc.db\n")

	tests := []struct {
		name string
		env  map[string]string
		args []string
		want []string
	}{
		{"file", nil, []string{"--data", dir}, []string{"listen:                127.0.0.1:1001", "key_rotation:          48h0m0s", "allowed_authorities:   prod-ababab",
			"store:                 sqlite://" + filepath.Join(dir, "discovery.db")}},
		{"env over file", map[string]string{"MUSTER_LISTEN": "127.0.0.1:1003"}, []string{"--data", dir}, []string{"listen:                127.0.0.1:1003", "key_rotation:          48h0m0s"}},
		{"flag over env", map[string]string{"MUSTER_LISTEN": "127.0.0.1:1003"}, []string{"--data", dir, "--listen", "127.0.0.1:1004"}, []string{"listen:                127.0.0.1:1004"}},
		{"--config replaces DIR/discovery.yaml", nil, []string{"--data", dir, "--config", other},
			[]string{"listen:                127.0.0.1:1002", "store:                 postgres://d@db.internal/disc", "allowed_authorities:   (off)", "config file:           " + other}},
		{"a relative SQLite store is under DIR, not the file's directory", nil, []string{"--data", dir, "--config", relative},
			[]string{"store:                 sqlite://" + filepath.Join(dir, "db", "disc.db")}},
		{"limits by default", nil, []string{"--data", dir}, []string{"limits.max_calls_per_source: 1024 (per source address)\n", "limits.call_timeout:   1m0s\n"}},
		{"limits from a file", nil, []string{"--data", dir, "--config", limits}, []string{"limits.max_calls_per_source: 64 (", "limits.call_timeout:   2m0s\n"}},
		{"limits from the environment over the file", map[string]string{"MUSTER_MAX_CALLS_PER_SOURCE": "5000", "MUSTER_CALL_TIMEOUT": "30s"}, []string{"--data", dir, "--config", limits},
			[]string{"limits.max_calls_per_source: 5000 (", "limits.call_timeout:   30s\n"}},
		{"MUSTER_DATA, a directory not made yet", map[string]string{"MUSTER_DATA": fresh}, nil, []string{"data:                  " + fresh}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCLIEnv(t, tt.env, append([]string{"discovery", "--check-config"}, tt.args...)...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			if !strings.HasPrefix(stdout, "configuration OK: discovery") || strings.Contains(stdout, "secret") {
				t.Errorf("output:\n%s", stdout)
			}
			for _, w := range tt.want {
				if !strings.Contains(stdout, w) {
					t.Errorf("output lacks %q:\n%s", w, stdout)
				}
			}
		})
	}
	if _, err := os.Stat(fresh); !os.IsNotExist(err) {
		t.Errorf("--check-config created the data directory: %v", err)
	}

	bad := []struct {
		name, file string
		args       []string
		want       string
	}{
		{name: "unknown key", file: "listen: a:1\nlisten_addr: b:2\n", want: `line 2: unknown setting "listen_addr"`},
		{name: "bad key rotation", file: "key_rotation: monthly\n", want: `key_rotation "monthly": want a duration such as 720h`},
		{name: "key rotation out of bounds", file: "key_rotation: 1s\n", want: "key rotation (--key-rotation, key_rotation) must be between"},
		{name: "wildcard issuer", file: "listen: 0.0.0.0:7450\n", want: "advertise"},
		{name: "bad trusted proxy", file: "trusted_proxies: [not-an-ip]\n", want: "not-an-ip"},
		{name: "bad allow entry", file: "allowed_authorities: [{authority_id: Prod, ca_fingerprint: \"" + fp + "\"}]\n", want: "allowed_authorities[0]"},
		{name: "negative calls per source", file: "limits:\n  max_calls_per_source: -1\n", want: "limits.max_calls_per_source -1: want a number of calls, such as 1024"},
		{name: "call timeout below the floor", file: "limits:\n  call_timeout: 500ms\n", want: `limits.call_timeout "500ms": want a duration of at least 1s, such as 1m`},
		{name: "call timeout flag below the floor", args: []string{"--call-timeout", "10ms"}, want: "limits.call_timeout 10ms (--call-timeout): want a duration of at least 1s"},
		{name: "missing --config", args: []string{"--config", filepath.Join(dir, "nope.yaml")}, want: "--config: stat"},
		{name: "pprof beyond loopback", args: []string{"--pprof-listen", ":6060"}, want: "pprof listens only on a loopback address"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			cfg := write(filepath.Join(t.TempDir(), "discovery.yaml"), tt.file)
			args := append([]string{"discovery", "--check-config", "--data", dir, "--config", cfg}, tt.args...)
			code, _, stderr := runCLIEnv(t, nil, args...)
			if code == 0 || !strings.Contains(stderr, tt.want) || strings.Contains(stderr, "cli.") {
				t.Errorf("exit %d, stderr %q; want a refusal with %q", code, stderr, tt.want)
			}
		})
	}
}
