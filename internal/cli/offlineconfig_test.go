package cli

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/store"
)

// offlineConfigDir makes an authority whose store URL is only in a
// settings file outside its data directory, as the packaged unit keeps
// it in /etc/muster/authority.yaml: the store moved out of DIR, and
// authority.json naming none. Both paths hold a space.
func offlineConfigDir(t *testing.T) (dir, cfg, storeURL string) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "data dir")
	if code, _, stderr := runCLI(t, "init", "--data", dir); code != 0 {
		t.Fatalf("init: %s", stderr)
	}
	if info, err := datadir.Dir(dir).ReadInfo(); err != nil || info.Store != "" {
		t.Fatalf("authority.json names a store (%q, %v): the test needs one that names none", info.Store, err)
	}
	db := filepath.Join(t.TempDir(), "the store", "muster.db")
	if err := os.MkdirAll(filepath.Dir(db), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, suffix := range []string{"", "-wal", "-shm"} {
		if err := os.Rename(datadir.Dir(dir).DatabaseFile()+suffix, db+suffix); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	cfg = filepath.Join(t.TempDir(), "etc muster", "authority.yaml")
	if err := os.MkdirAll(filepath.Dir(cfg), 0o700); err != nil {
		t.Fatal(err)
	}
	storeURL = "sqlite://" + db
	if err := os.WriteFile(cfg, []byte("store: "+storeURL+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, cfg, storeURL
}

// auditActions is the actions of the records of the store at url.
func auditActions(t *testing.T, url string) []string {
	t.Helper()
	st, err := openStore(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	recs, err := st.ListAudit(context.Background(), store.AuditFilter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var actions []string
	for _, r := range recs {
		actions = append(actions, r.Action+"/"+r.Result)
	}
	return actions
}

// TestOfflineCommandsReadConfig: every command that opens the
// authority's store from its data directory takes --config FILE, read
// as muster authority --config reads it, and acts on the store FILE
// names; without it the store is not found.
func TestOfflineCommandsReadConfig(t *testing.T) {
	dir, cfg, url := offlineConfigDir(t)
	out := filepath.Join(t.TempDir(), "alice.pem")
	for _, c := range []struct {
		name string
		args []string
		// ok: it succeeds; else want is in its refusal, which only the
		// store could give.
		ok     bool
		want   string
		action string // the audit record it appends, if any
	}{
		{name: "admin add", args: []string{"admin", "add", "alice", "--offline", "--out", out}, ok: true, want: "signed offline and audited", action: "operator.add/ok"},
		{name: "audit list", args: []string{"audit", "list", "--offline", "--action", "operator.add"}, ok: true, want: "operator.add"},
		{name: "audit verify", args: []string{"audit", "verify", "--offline"}, ok: true},
		{name: "settings list", args: []string{"settings", "list", "--offline"}, ok: true, want: "signer.min_lead_time"},
		{name: "ca rotate", args: []string{"ca", "rotate", "agent", "--offline"}, want: "the store has no active agent intermediate"},
		{name: "ca migrate-custody", args: []string{"ca", "migrate-custody", "--custody", "pkcs11:token=muster", "--rollback"}, ok: true, want: "The store records no token"},
		{name: "ca root export-key", args: []string{"ca", "root", "export-key", "--out", filepath.Join(t.TempDir(), "root.key")}, want: "no finished root rotation", action: "ca.root_export_key/denied"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if code, _, stderr := runCLI(t, append(c.args, "--data", dir)...); code == 0 || !strings.Contains(stderr, "store") {
				t.Errorf("without --config: exit %d, %s; want a refusal naming the store", code, stderr)
			}
			before := len(auditActions(t, url))
			code, stdout, stderr := runCLI(t, append(c.args, "--data", dir, "--config", cfg)...)
			if (code == 0) != c.ok || !strings.Contains(stdout+stderr, c.want) {
				t.Fatalf("with --config: exit %d, want ok %v and %q:\n%s%s", code, c.ok, c.want, stdout, stderr)
			}
			after := auditActions(t, url)
			if c.action != "" && (len(after) <= before || !hasString(after[before:], c.action)) {
				t.Errorf("with --config: no %s record appended to the store of %s: %v", c.action, cfg, after[before:])
			}
		})
	}
}

func hasString(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}

// TestOfflineWayOutNamesConfig: the offline command a refusal names
// carries --config FILE when the authority reads its settings from FILE
// outside DIR, and pasted, acts on the store FILE names.
func TestOfflineWayOutNamesConfig(t *testing.T) {
	dir, cfg, _ := offlineConfigDir(t)
	od := offlineDir{dir: datadir.Dir(dir), configPath: cfg}
	if got := (offlineDir{dir: datadir.Dir(dir), configPath: datadir.Dir(dir).ConfigFile()}).configArg(); got != "" {
		t.Errorf("DIR/authority.yaml adds %q to --data DIR", got)
	}
	// authority.json names the token, the store none and signs with
	// sealed keys: the way out is a rollback.
	local := &datadir.Custody{URI: "pkcs11:token=muster", Module: "/usr/lib/softhsm/libsofthsm2.so"}
	_, err := storeCustody(context.Background(), recordedCustody{cas: []store.CACert{{Role: "agent", Serial: "1", State: store.CAActive, KeyRef: []byte("sealed")}}}, od, local, "")
	if err == nil {
		t.Fatal("custody out of step: no refusal")
	}
	const start, end = "`muster ca migrate-custody ", "` (it removes"
	i := strings.Index(err.Error(), start)
	j := strings.Index(err.Error(), end)
	if i < 0 || j < i {
		t.Fatalf("no rollback named: %v", err)
	}
	pasted := err.Error()[i+len("`muster ") : j]
	if !strings.Contains(pasted, "--config") {
		t.Fatalf("the way out %q does not name --config", pasted)
	}
	args, err := exec.Command("sh", "-c", "printf '%s\\n' "+pasted).Output()
	if err != nil {
		t.Fatal(err)
	}
	if code, stdout, stderr := runCLI(t, strings.Split(strings.TrimSuffix(string(args), "\n"), "\n")...); code != 0 || !strings.Contains(stdout, "The store records no token") {
		t.Fatalf("the pasted way out, muster %s: exit %d\n%s%s", pasted, code, stdout, stderr)
	}
}

// TestOfflineCommandsReadMusterConfig: MUSTER_CONFIG names the settings
// file to the offline commands as it does to muster authority (withEnv),
// beside the MUSTER_DATA and MUSTER_STORE they read already: in a
// container or shell that starts the authority so, they open the store
// it does, not DIR/authority.yaml's.
func TestOfflineCommandsReadMusterConfig(t *testing.T) {
	dir, cfg, url := offlineConfigDir(t)
	vars := map[string]string{"MUSTER_DATA": dir, "MUSTER_CONFIG": cfg}
	if code, stdout, stderr := runCLIEnv(t, vars, "audit", "verify", "--offline"); code != 0 {
		t.Fatalf("audit verify --offline with MUSTER_CONFIG: exit %d\n%s%s", code, stdout, stderr)
	}
	out := filepath.Join(t.TempDir(), "alice.pem")
	before := len(auditActions(t, url))
	if code, stdout, stderr := runCLIEnv(t, vars, "admin", "add", "alice", "--offline", "--out", out); code != 0 {
		t.Fatalf("admin add --offline with MUSTER_CONFIG: exit %d\n%s%s", code, stdout, stderr)
	}
	if after := auditActions(t, url); !hasString(after[before:], "operator.add/ok") {
		t.Errorf("no operator.add record in the store MUSTER_CONFIG names: %v", after[before:])
	}
	// --config beats MUSTER_CONFIG, as for muster authority.
	vars["MUSTER_CONFIG"] = filepath.Join(t.TempDir(), "missing.yaml")
	if code, stdout, stderr := runCLIEnv(t, vars, "audit", "verify", "--offline", "--config", cfg); code != 0 {
		t.Fatalf("--config over MUSTER_CONFIG: exit %d\n%s%s", code, stdout, stderr)
	}
}
