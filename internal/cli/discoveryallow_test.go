package cli

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/muster-dev/muster/internal/discovery"
	"github.com/muster-dev/muster/internal/discoveryd"
)

// Fingerprints whose authority IDs are prod-a3f2e1 and web-b4c5d6.
var (
	fpProd = "sha256:a3f2e1" + strings.Repeat("0", 58)
	fpWeb  = "sha256:b4c5d6" + strings.Repeat("1", 58)
)

// runCLI runs muster in-process and returns its exit code and output.
func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Run(context.Background(), args, Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb, Getenv: func(string) string { return "" }})
	return code, out.String(), errb.String()
}

func TestRegistrationSettings(t *testing.T) {
	tests := []struct {
		name  string
		file  string // DIR/discovery.yaml; "" : none
		flags []string
		open  bool
		want  []discovery.AllowEntry
		// err is part of the refusal; log part of what is logged.
		err string
		log string
	}{
		{name: "nothing", want: []discovery.AllowEntry{}, log: "no authority is allowed to register"},
		{name: "open, nothing listed", open: true, want: []discovery.AllowEntry{}, log: "UNSAFE: --open-registration"},
		{name: "flags", flags: []string{"web-b4c5d6=" + fpWeb, "prod-a3f2e1=sha256:" + strings.ToUpper(fpProd[7:])},
			want: []discovery.AllowEntry{{AuthorityID: "prod-a3f2e1", Fingerprint: fpProd}, {AuthorityID: "web-b4c5d6", Fingerprint: fpWeb}}, log: "allowed_authorities=prod-a3f2e1,web-b4c5d6"},
		{name: "file", file: "allowed_authorities:\n  - authority_id: prod-a3f2e1\n    ca_fingerprint: " + fpProd + "\n",
			want: []discovery.AllowEntry{{AuthorityID: "prod-a3f2e1", Fingerprint: fpProd}}, log: "authorities allowed to register"},
		{name: "flow style file", file: "allowed_authorities: [{authority_id: web-b4c5d6, ca_fingerprint: \"" + fpWeb + "\"}]\n",
			want: []discovery.AllowEntry{{AuthorityID: "web-b4c5d6", Fingerprint: fpWeb}}},
		{name: "flags add to the file", file: "allowed_authorities: [{authority_id: prod-a3f2e1, ca_fingerprint: " + fpProd + "}]\n",
			flags: []string{"web-b4c5d6=" + fpWeb, "prod-a3f2e1=" + fpProd}, open: true,
			want: []discovery.AllowEntry{{AuthorityID: "prod-a3f2e1", Fingerprint: fpProd}, {AuthorityID: "web-b4c5d6", Fingerprint: fpWeb}}, log: "UNSAFE"},
		{name: "empty file", file: "\n", want: []discovery.AllowEntry{}},
		{name: "flag with another root than the file", file: "allowed_authorities: [{authority_id: prod-a3f2e1, ca_fingerprint: " + fpProd + "}]\n",
			flags: []string{"prod-a3f2e1=sha256:a3f2e1" + strings.Repeat("9", 58)}, err: "allowed twice"},
		{name: "malformed flag", flags: []string{"prod-a3f2e1"}, err: "--allow-authority: discovery: allowed authority \"prod-a3f2e1\": want AUTHORITY_ID=sha256:HEX"},
		{name: "flag naming another root", flags: []string{"prod-a3f2e1=" + fpWeb}, err: "is not its root's"},
		{name: "unknown key", file: "allowed_authorities: []\nopen_registration: true\n", err: `line 2: unknown setting "open_registration"`},
		{name: "misspelt entry key", file: "allowed_authorities: [{authority_id: prod-a3f2e1, fingerprint: " + fpProd + "}]\n", err: `line 1: unknown setting "allowed_authorities[0].fingerprint"`},
		{name: "bad entry in the file", file: "allowed_authorities:\n  - {authority_id: prod-a3f2e1, ca_fingerprint: " + fpProd + "}\n  - {authority_id: Prod, ca_fingerprint: " + fpProd + "}\n",
			err: "allowed_authorities[1]: discovery: authority ID \"Prod\" is not NAME-HEX6"},
		{name: "not YAML", file: "allowed_authorities: [\n", err: "discovery.yaml"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := discoveryd.Dir(t.TempDir())
			if tt.file != "" {
				if err := os.WriteFile(dir.ConfigFile(), []byte(tt.file), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			var logs bytes.Buffer
			got, err := registrationSettings(dir.ConfigFile(), tt.flags, tt.open, slog.New(slog.NewTextHandler(&logs, nil)))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) || strings.Contains(err.Error(), "\n") {
					t.Fatalf("registrationSettings = %v, %v; want one line containing %q", got, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("entries (-want +got):\n%s", diff)
			}
			if !strings.Contains(logs.String(), tt.log) {
				t.Errorf("logged %q, want it to contain %q", logs.String(), tt.log)
			}
		})
	}
}

// TestDiscoveryFlags parses the flags as muster discovery does: repeated
// and comma-separated --allow-authority, and the refusals that stop it
// before it listens.
func TestDiscoveryFlags(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "discovery")
	base := []string{"discovery", "--data", dir, "--metrics-listen", "", "--log-format", "text"}

	// An issuer naming no machine stops discovery after the settings
	// are read, so they can be seen in the log.
	code, _, stderr := runCLI(t, append(base, "--listen", "0.0.0.0:0", "--allow-authority", "web-b4c5d6="+fpWeb,
		"--allow-authority", "prod-a3f2e1="+fpProd+",web-b4c5d6="+fpWeb)...)
	if code == 0 || !strings.Contains(stderr, "allowed_authorities=prod-a3f2e1,web-b4c5d6") {
		t.Errorf("exit %d, stderr:\n%s\nwant both authorities allowed", code, stderr)
	}
	if !strings.Contains(stderr, "muster: discovery: discoveryd: the ticket issuer https://0.0.0.0:0 would name no machine") ||
		!strings.Contains(stderr, "set --advertise") {
		t.Errorf("stderr:\n%s\nwant the refusal of an unspecified issuer", stderr)
	}
	code, _, stderr = runCLI(t, append(base, "--listen", "0.0.0.0:0", "--open-registration")...)
	if code == 0 || !strings.Contains(stderr, "UNSAFE: --open-registration") {
		t.Errorf("--open-registration: exit %d, stderr:\n%s", code, stderr)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--allow-authority", "prod-a3f2e1:" + fpProd}, "muster: discovery: --allow-authority: discovery: allowed authority"},
		{[]string{"--allow-authority", "prod-a3f2e1=" + fpProd, "--allow-authority", "prod-a3f2e1=" + fpWeb}, "is not its root's"},
		{[]string{"--open-registration=maybe"}, "invalid argument"},
	} {
		code, _, stderr := runCLI(t, append(base, tt.args...)...)
		if code == 0 || !strings.Contains(stderr, tt.want) {
			t.Errorf("%v: exit %d, stderr:\n%s\nwant %q", tt.args, code, stderr, tt.want)
		}
	}
}
