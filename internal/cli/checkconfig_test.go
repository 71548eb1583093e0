package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/listener"
)

func runCLIEnv(t *testing.T, vars map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Run(context.Background(), args, Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb,
		Getenv: func(k string) string { return vars[k] }})
	return code, out.String(), errb.String()
}

// TestAuthoritySettingsPrecedence: a flag beats its MUSTER_* variable,
// which beats the settings file, which beats the default; --check-config
// prints what is in force and starts nothing.
func TestAuthoritySettingsPrecedence(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "d")
	if code, _, stderr := runCLI(t, "init", "--data", dir); code != 0 {
		t.Fatalf("init: %s", stderr)
	}
	other := filepath.Join(t.TempDir(), "other.yaml")
	write := func(path, body string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(dir, "authority.yaml"), "listen: 127.0.0.1:1001\nmetrics_listen: 127.0.0.1:2001\nadvertise: file.example:1\n")
	write(other, "listen: 127.0.0.1:1002\n")
	withMore := filepath.Join(t.TempDir(), "more.yaml")
	write(withMore, "signer:\n  min_lead_time: 30m\nbound_keypair:\n  recoveries_warn_at: 3\n  cert_ttl: 2h\ndiscovery:\n  address: disc.example:7450\nbootstrap:\n  psk_required: true\nlog:\n  format: text\n")
	withKeysRefresh := filepath.Join(t.TempDir(), "keys.yaml")
	write(withKeysRefresh, "discovery:\n  address: disc.example:7450\n  keys_refresh: 30s\n")
	withLimits := filepath.Join(t.TempDir(), "limits.yaml")
	write(withLimits, "limits:\n  max_calls_per_source: 64\n  renewals_per_lifetime: 4\n")
	withDraft := filepath.Join(t.TempDir(), "draft.yaml")
	write(withDraft, "ca:\n  draft_ttl: 10s\n")
	withJWT := filepath.Join(t.TempDir(), "jwt.yaml")
	write(withJWT, "jwt_svid:\n  key_rotation_period: 1h\n")
	withStoreTimeout := filepath.Join(t.TempDir(), "store.yaml")
	write(withStoreTimeout, "limits:\n  store_timeout: 15s\n")
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want []string
	}{
		{"file", nil, nil, []string{"listen:                127.0.0.1:1001", "metrics_listen:        127.0.0.1:2001", "advertise:             file.example:1"}},
		{"env over file", map[string]string{"MUSTER_LISTEN": "127.0.0.1:1003"}, nil, []string{"listen:                127.0.0.1:1003", "metrics_listen:        127.0.0.1:2001"}},
		{"flag over env", map[string]string{"MUSTER_LISTEN": "127.0.0.1:1003"}, []string{"--listen", "127.0.0.1:1004"}, []string{"listen:                127.0.0.1:1004"}},
		{"--config replaces DIR/authority.yaml", nil, []string{"--config", other}, []string{"listen:                127.0.0.1:1002", "metrics_listen:        127.0.0.1:7444", "advertise:             (not set: agents are given the listen address, 127.0.0.1:1002, as the API binds it)"}},
		{"MUSTER_DATA and a password-free store URL", map[string]string{"MUSTER_DATA": dir, "MUSTER_STORE": "postgres://muster:secret@db.internal/muster"}, []string{}, []string{"store:                 postgres://muster@db.internal/muster"}},
		{"defaults in force", nil, nil, []string{"signer.min_lead_time:  10m0s", "bound_keypair.recoveries_warn_at: 1", "bound_keypair.cert_ttl: 1h0m0s",
			"log.format:            json (text on a terminal)", "bootstrap.psk_optional_until: (off)"}},
		{"signer, bound keypair and discovery from a file", nil, []string{"--config", withMore}, []string{"signer.min_lead_time:  30m0s",
			"bound_keypair.recoveries_warn_at: 3", "bound_keypair.cert_ttl: 2h0m0s", "discovery.address:     disc.example:7450",
			"discovery.register_every: 10m0s", "discovery.keys_refresh: 1m0s (how long a ticket key discovery revoked may still be accepted)", "log.format:            text"}},
		{"the ticket keys' refresh from a file", nil, []string{"--config", withKeysRefresh}, []string{"discovery.keys_refresh: 30s ("}},
		{"the connection cap from the environment", map[string]string{"MUSTER_MAX_CONNECTIONS": "77"}, nil, []string{"limits.max_connections: 77 (api and bootstrap listeners together)\n"}},
		{"the call timeout by default", nil, nil, []string{"limits.call_timeout:   1m0s\n"}},
		{"the call timeout from the environment", map[string]string{"MUSTER_CALL_TIMEOUT": "5m"}, nil, []string{"limits.call_timeout:   5m0s\n"}},
		{"the calls per source by default", nil, nil, []string{"limits.max_calls_per_source: 1024 (per source address, agents' streams aside)\n"}},
		{"the calls per source from the environment", map[string]string{"MUSTER_MAX_CALLS_PER_SOURCE": "5000"}, nil, []string{"limits.max_calls_per_source: 5000 ("}},
		{"the calls per source from a file", nil, []string{"--config", withLimits}, []string{"limits.max_calls_per_source: 64 ("}},
		{"the renewals per lifetime by default", nil, nil, []string{"limits.renewals_per_lifetime: 10 (per agent instance, in this replica's memory)\n"}},
		{"the renewals per lifetime from the environment", map[string]string{"MUSTER_RENEWALS_PER_LIFETIME": "50"}, nil, []string{"limits.renewals_per_lifetime: 50 ("}},
		{"the renewals per lifetime from a file", nil, []string{"--config", withLimits}, []string{"limits.renewals_per_lifetime: 4 ("}},
		{"the store timeout by default", nil, nil, []string{"limits.store_timeout:  10s\n"}},
		{"the store timeout from the environment", map[string]string{"MUSTER_STORE_TIMEOUT": "4s"}, nil, []string{"limits.store_timeout:  4s\n"}},
		{"the store timeout from the file", nil, []string{"--config", withStoreTimeout}, []string{"limits.store_timeout:  15s\n"}},
		{"the open-file limit the cap's default came from, and that it is this command's", nil, nil, []string{"open_file_limit:       " + fileLimit(t) + ", this command's: the authority reads its own at start (LimitNOFILE"}},
		{"a bool from the environment", map[string]string{"MUSTER_PSK_REQUIRED": "true", "MUSTER_AGENT_CERT_TTL": "2h"}, nil, []string{"bootstrap.psk_required: true", "agent_cert_ttl:        2h0m0s"}},
		{"the intermediates' lifetime by default", nil, nil, []string{"ca.intermediate_ttl:   8760h0m0s"}},
		{"the intermediates' lifetime from the environment", map[string]string{"MUSTER_CA_INTERMEDIATE_TTL": "3m"}, nil, []string{"ca.intermediate_ttl:   3m0s"}},
		{"a draft's lifetime by default", nil, nil, []string{"ca.draft_ttl:          1h0m0s (the default: not set here; a shared setting, the store's value is in force if it holds one: muster settings list)\n"}},
		{"a draft's lifetime from the environment", map[string]string{"MUSTER_CA_DRAFT_TTL": "90s"}, nil, []string{"ca.draft_ttl:          1m30s (from --ca-draft-ttl (or MUSTER_CA_DRAFT_TTL); a shared setting"}},
		{"a draft's lifetime from the file", nil, []string{"--config", withDraft}, []string{"ca.draft_ttl:          10s (this settings file's; a shared setting: on SQLite the start writes it to the store, on PostgreSQL a store holding another refuses the start: muster settings list)\n"}},
		{"a draft's lifetime, the flag over the file", nil, []string{"--config", withDraft, "--ca-draft-ttl", "2h"}, []string{"ca.draft_ttl:          2h0m0s (from --ca-draft-ttl (or MUSTER_CA_DRAFT_TTL); a shared setting"}},
		// A shared setting's value in force is the store's, which
		// --check-config does not open: it says whose value it prints
		// (a replica printed the default 720h as if in force while the
		// store held 1h).
		{"the key rotation period by default, labelled", nil, nil, []string{"jwt_svid.key_rotation_period: 720h0m0s (the default: not set here; a shared setting, the store's value is in force if it holds one: muster settings list)\n"}},
		{"the key rotation period from the file, labelled", nil, []string{"--config", withJWT}, []string{"jwt_svid.key_rotation_period: 1h0m0s (this settings file's; a shared setting: on SQLite the start writes it to the store, on PostgreSQL a store holding another refuses the start: muster settings list)\n"}},
		{"the key rotation period from the environment, labelled", map[string]string{"MUSTER_JWT_KEY_ROTATION_PERIOD": "2h"}, nil, []string{"jwt_svid.key_rotation_period: 2h0m0s (from --jwt-key-rotation-period (or MUSTER_JWT_KEY_ROTATION_PERIOD); a shared setting"}},
		{"the signer lead time by default, labelled", nil, nil, []string{"signer.min_lead_time:  10m0s (the default: not set here; a shared setting, the store's value is in force if it holds one: muster settings list)\n"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"authority", "--check-config"}, tt.args...)
			if tt.env["MUSTER_DATA"] == "" {
				args = append(args, "--data", dir)
			}
			code, stdout, stderr := runCLIEnv(t, tt.env, args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			if !strings.HasPrefix(stdout, "configuration OK: authority ") || strings.Contains(stdout, "secret") {
				t.Errorf("output:\n%s", stdout)
			}
			for _, w := range tt.want {
				if !strings.Contains(stdout, w) {
					t.Errorf("output lacks %q:\n%s", w, stdout)
				}
			}
		})
	}
}

// fileLimit is this process's open-file limit as --check-config prints it.
func fileLimit(t *testing.T) string {
	n, ok := listener.FileLimit()
	if !ok {
		return "unknown"
	}
	return strconv.FormatUint(n, 10)
}

// TestAuthorityConfigErrors: a bad setting names the setting (by its path
// in the file, or its variable) and what it takes, never a Go type, and
// never echoes a value from the environment.
func TestAuthorityConfigErrors(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "d")
	if code, _, stderr := runCLI(t, "init", "--data", dir); code != 0 {
		t.Fatalf("init: %s", stderr)
	}
	tests := []struct {
		name string
		file string
		env  map[string]string
		args []string
		want string
	}{
		{name: "unknown key", file: "listen: a:1\nlisten_addr: b:2\n", want: `line 2: unknown setting "listen_addr"`},
		{name: "unknown nested key", file: "discovery:\n  address: d:1\n  polcy: {}\n", want: `line 3: unknown setting "discovery.polcy"`},
		{name: "wrong kind", file: "bootstrap:\n  psk_required: maybe\n", want: `line 2: bootstrap.psk_required: want true or false, not "maybe"`},
		{name: "list expected", file: "trusted_proxies: 10.0.0.1\n", want: `line 1: trusted_proxies: want a list`},
		{name: "number expected", file: "discovery:\n  policy:\n    new_agents_per_day: many\n", want: `line 3: discovery.policy.new_agents_per_day: want a number, not "many"`},
		{name: "keys refresh below the floor", file: "discovery:\n  address: d:1\n  keys_refresh: 10s\n", want: `discovery.keys_refresh "10s": want a duration from 30s to 10m0s, such as 1m0s (the default)`},
		{name: "keys refresh above the ceiling", file: "discovery:\n  address: d:1\n  keys_refresh: 1h\n", want: `discovery.keys_refresh "1h": want a duration from 30s to 10m0s, such as 1m0s (the default)`},
		{name: "keys refresh not a duration", file: "discovery:\n  address: d:1\n  keys_refresh: often\n", want: `discovery.keys_refresh "often": want a duration from 30s to 10m0s`},
		{name: "bad ttl", file: "agent_cert_ttl: forever\n", want: `agent_cert_ttl "forever": want a duration of at most 168h, such as 24h`},
		{name: "ttl above the ceiling", file: "agent_cert_ttl: 200h\n", want: `agent_cert_ttl "200h": want a duration of at most 168h, such as 24h`},
		{name: "bound ttl above the ceiling", env: map[string]string{"MUSTER_BOUND_KEYPAIR_CERT_TTL": "169h"}, want: `bound_keypair.cert_ttl "169h": want a duration of at most 168h, such as 1h`},
		{name: "intermediate ttl below the floor", file: "ca:\n  intermediate_ttl: 1m\n", want: `ca.intermediate_ttl "1m": want a duration from 2m0s to 87600h0m0s`},
		{name: "draft ttl below the floor", file: "ca:\n  draft_ttl: 4s\n", want: `ca.draft_ttl "4s": want a duration from 5s to 24h0m0s, such as 1h`},
		{name: "draft ttl above the ceiling", env: map[string]string{"MUSTER_CA_DRAFT_TTL": "25h"}, want: `ca.draft_ttl "25h": want a duration from 5s to 24h0m0s, such as 1h`},
		{name: "draft ttl not a duration", args: []string{"--ca-draft-ttl", "soon"}, want: `ca.draft_ttl "soon": want a duration from 5s to 24h0m0s, such as 1h`},
		{name: "negative calls per source", file: "limits:\n  max_calls_per_source: -1\n", want: `limits.max_calls_per_source -1: want a number of calls, such as 1024 (the default)`},
		{name: "negative renewals per lifetime", file: "limits:\n  renewals_per_lifetime: -2\n", want: `limits.renewals_per_lifetime -2: want a number of renewals, such as 10 (the default)`},
		{name: "call timeout below the floor", file: "limits:\n  call_timeout: 500ms\n", want: `limits.call_timeout "500ms": want a duration of at least 1s, such as 1m`},
		{name: "store timeout below the floor", file: "limits:\n  store_timeout: 500ms\n", want: `limits.store_timeout "500ms": want a duration from 1s to 20s, such as 10s`},
		{name: "store timeout above the ceiling", env: map[string]string{"MUSTER_STORE_TIMEOUT": "30s"}, want: `limits.store_timeout "30s": want a duration from 1s to 20s, such as 10s`},
		{name: "store timeout not a duration", args: []string{"--store-timeout", "soon"}, want: `limits.store_timeout "soon": want a duration from 1s to 20s, such as 10s`},
		{name: "bad env bool", env: map[string]string{"MUSTER_PSK_REQUIRED": "secretish"}, want: "environment variable MUSTER_PSK_REQUIRED: want true or false"},
		{name: "bad store scheme", env: map[string]string{"MUSTER_STORE": "mysql://u:pw@h/db"}, want: `store URL must start with sqlite://, postgres:// or postgresql:// (got "mysql://u@h/db")`},
		{name: "missing --config", args: []string{"--config", filepath.Join(dir, "nope.yaml")}, want: "--config: stat"},
		{name: "pprof beyond loopback", args: []string{"--pprof-listen", ":6060"}, want: "pprof listens only on a loopback address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			os.Remove(filepath.Join(dir, "authority.yaml"))
			if tt.file != "" {
				if err := os.WriteFile(filepath.Join(dir, "authority.yaml"), []byte(tt.file), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			code, _, stderr := runCLIEnv(t, tt.env, append([]string{"authority", "--check-config", "--data", dir}, tt.args...)...)
			if code == 0 || !strings.Contains(stderr, tt.want) {
				t.Errorf("exit %d, stderr %q; want a refusal with %q", code, stderr, tt.want)
			}
			for _, leak := range []string{"cli.", "authorityConfig", "!!str", "secretish", "pw@"} {
				if strings.Contains(stderr, leak) {
					t.Errorf("stderr %q shows %q", stderr, leak)
				}
			}
		})
	}
}

func TestParseCADraftTTL(t *testing.T) {
	for v, want := range map[string]time.Duration{"5s": 5 * time.Second, "1h": time.Hour, "24h": 24 * time.Hour, "90s": 90 * time.Second} {
		if got, err := parseCADraftTTL(v); err != nil || got != want {
			t.Errorf("parseCADraftTTL(%q) = %v, %v; want %v", v, got, err, want)
		}
	}
	for _, v := range []string{"", "4s", "4.999s", "24h0m1s", "-1h", "0", "1", "an hour"} {
		if got, err := parseCADraftTTL(v); err == nil || !strings.Contains(err.Error(), "ca.draft_ttl") {
			t.Errorf("parseCADraftTTL(%q) = %v, %v; want an error naming ca.draft_ttl", v, got, err)
		}
	}
}

// TestCheckConfigKeyCustody: --check-config says where the keys are, and
// refuses, as the start does, what cannot open the token authority.json
// names: the static build, or (the pkcs11 build) a module that is not
// there. It said "configuration OK" and then the start was refused.
func TestCheckConfigKeyCustody(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "d")
	if code, _, stderr := runCLI(t, "init", "--data", dir); code != 0 {
		t.Fatalf("init: %s", stderr)
	}
	code, stdout, stderr := runCLI(t, "authority", "--data", dir, "--check-config")
	if code != 0 || !strings.Contains(stdout, "key_custody:           sealed") {
		t.Fatalf("sealed: exit %d\n%s%s", code, stdout, stderr)
	}
	if code, _, stderr := runCLI(t, "authority", "--data", dir, "--check-config", "--pkcs11-module", "/opt/hsm.so"); code == 0 || !strings.Contains(stderr, "names none") {
		t.Errorf("a module for sealed keys: exit %d\n%s", code, stderr)
	}
	d := datadir.Dir(dir)
	info, err := d.ReadInfo()
	if err != nil {
		t.Fatal(err)
	}
	info.Custody = &datadir.Custody{URI: "pkcs11:token=muster", Module: "/opt/hsm.so", PINFile: "/etc/muster/pkcs11-pin"}
	if err := d.WriteInfo(info); err != nil {
		t.Fatal(err)
	}
	// The static build cannot open it; the pkcs11 build finds no module.
	want := "needs the pkcs11 build"
	if custody.PKCS11Build {
		want = "the PKCS#11 module: stat /opt/hsm.so"
	}
	code, stdout, stderr = runCLI(t, "authority", "--data", dir, "--check-config")
	if code == 0 || strings.Contains(stdout, "configuration OK") || !strings.Contains(stderr, want) ||
		!strings.Contains(stderr, "muster-pkcs11 authority --data "+dir) {
		t.Errorf("a token on the static build: exit %d\n%s%s", code, stdout, stderr)
	}
}
