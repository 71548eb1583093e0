package cli

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/muster-dev/muster/internal/discoveryd"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/sqlite"
)

// discoveryWithRegistration is an initialised discovery directory whose
// store holds a registration of prod-a3f2e1 under fpProd.
func discoveryWithRegistration(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "discovery")
	id, err := discoveryd.Init(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := sqlite.Open(context.Background(), id.Dir.DatabaseFile())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, _, err := st.PutRegistration(context.Background(), store.Registration{AuthorityID: "prod-a3f2e1", RootFingerprint: fpProd,
		Version: 4, Document: []byte(`{}`), Signature: []byte("s")}, func(store.Registration) func(store.AuditHead) (store.AuditRecord, error) { return setupLink }); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestDiscoveryForget(t *testing.T) {
	dir := discoveryWithRegistration(t)
	code, stdout, stderr := runCLI(t, "discovery", "forget", "prod-a3f2e1", "--data", dir)
	if code != 0 {
		t.Fatalf("forget: exit %d\n%s", code, stderr)
	}
	for _, want := range []string{"Forgot authority prod-a3f2e1\n", "  CA:          " + fpProd + "\n", "  Version:     4\n", "  Registered:  20",
		"The ID is free"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("forget printed\n%s\nwant it to contain %q", stdout, want)
		}
	}
	code, _, stderr = runCLI(t, "discovery", "forget", "prod-a3f2e1", "--data", dir)
	if code == 0 || stderr != "muster: discovery forget: authority prod-a3f2e1 is not registered with this discovery\n" {
		t.Errorf("forget again: exit %d, stderr %q", code, stderr)
	}

	dir = discoveryWithRegistration(t)
	code, stdout, stderr = runCLI(t, "discovery", "forget", "prod-a3f2e1", "--data", dir, "-o", "json")
	var res forgetJSON
	if code != 0 || json.Unmarshal([]byte(stdout), &res) != nil {
		t.Fatalf("forget -o json: exit %d, %q\n%s", code, stdout, stderr)
	}
	if res.AuthorityID != "prod-a3f2e1" || res.CAFingerprint != fpProd || res.Version != 4 || res.RegisteredAt.IsZero() {
		t.Errorf("forget -o json = %+v", res)
	}

	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"discovery", "forget", "Prod", "--data", dir}, "NAME-HEX6"},
		{[]string{"discovery", "forget", "prod-a3f2e1"}, "--data DIR is required"},
		{[]string{"discovery", "forget", "--data", dir}, "accepts 1 arg"},
		{[]string{"discovery", "forget", "prod-a3f2e1", "--data", filepath.Join(t.TempDir(), "none")}, "does not exist"},
	} {
		code, _, stderr := runCLI(t, tt.args...)
		if code == 0 || !strings.Contains(stderr, tt.want) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q; want one line containing %q", tt.args, code, stderr, tt.want)
		}
	}
}

func TestDiscoveryShowAllowed(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "discovery")
	if _, err := discoveryd.Init(dir); err != nil {
		t.Fatal(err)
	}
	_, stdout, _ := runCLI(t, "discovery", "show", "--data", dir)
	// show reads the directory, not the running service's flags: it says
	// what the file allows, never that every registration is refused.
	if !strings.Contains(stdout, "Allowed:      no authority in "+discoveryd.Dir(dir).ConfigFile()+"; the running service's --allow-authority") ||
		strings.Contains(stdout, "refused") {
		t.Errorf("show without discovery.yaml printed\n%s", stdout)
	}
	if err := os.WriteFile(discoveryd.Dir(dir).ConfigFile(), []byte("allowed_authorities:\n  - {authority_id: web-b4c5d6, ca_fingerprint: \"sha256:"+
		strings.ToUpper(fpWeb[7:])+"\"}\n  - {authority_id: prod-a3f2e1, ca_fingerprint: "+fpProd+"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runCLI(t, "discovery", "show", "--data", dir)
	if code != 0 {
		t.Fatalf("show: exit %d\n%s", code, stderr)
	}
	for _, want := range []string{"(the running service's --allow-authority or --open-registration flags may allow more):\n  web-b4c5d6   " + fpWeb + "\n  prod-a3f2e1  " + fpProd + "\n"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("show printed\n%s\nwant it to contain %q", stdout, want)
		}
	}
	_, stdout, _ = runCLI(t, "discovery", "show", "--data", dir, "-o", "json")
	var res discoveryShowJSON
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatal(err)
	}
	if len(res.AllowedAuthorities) != 2 || res.AllowedAuthorities[0] != (allowedJSON{"web-b4c5d6", fpWeb}) {
		t.Errorf("show -o json: %+v", res.AllowedAuthorities)
	}
	os.WriteFile(discoveryd.Dir(dir).ConfigFile(), []byte("allow: []\n"), 0o600)
	if code, _, stderr := runCLI(t, "discovery", "show", "--data", dir); code == 0 || !strings.Contains(stderr, `unknown setting "allow"`) {
		t.Errorf("show with a misspelt key: exit %d, %q", code, stderr)
	}
}
