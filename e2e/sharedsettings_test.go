package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/shellword"
)

// TestSharedSettingsAcrossReplicasPostgres: two replicas on one
// PostgreSQL store with different authority.yaml files. The first to
// start records its shared settings in the store; a second whose file
// gives another value refuses to start, naming both values and the ways
// out; left out of its file, it uses the store's. muster settings set
// through one replica changes the value both use, without a restart, and
// both the first recording and the change are audited as setting.set.
func TestSharedSettingsAcrossReplicasPostgres(t *testing.T) {
	t.Parallel()
	url := postgres(t)
	dir := filepath.Join(t.TempDir(), "authority")
	mustRun(t, "init", "--data", dir, "--store", url)
	second := replicaDir(t, dir)
	writeYAML := func(d, yaml string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(d, "authority.yaml"), []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeYAML(dir, "signer:\n  min_lead_time: 2m\nca:\n  intermediate_ttl: 4380h\n")
	first := startAuthority(t, dir, "--store", url)
	logsOnFailure(t, "replica 1", first.Logs)

	settings := func(d string) map[string]settingLine {
		t.Helper()
		var list []settingLine
		if err := json.Unmarshal([]byte(mustRun(t, "settings", "list", "--data", d, "-o", "json")), &list); err != nil {
			t.Fatal(err)
		}
		m := map[string]settingLine{}
		for _, s := range list {
			m[s.Key] = s
		}
		return m
	}
	got := settings(dir)
	if s := got["signer.min_lead_time"]; s.Value != "2m0s" || s.Version != 1 || s.UpdatedBy != "authority" {
		t.Fatalf("signer.min_lead_time after the first start: %+v; want 2m0s recorded by the authority", s)
	}
	if s := got["ca.intermediate_ttl"]; s.Value != "4380h0m0s" || s.Version != 1 {
		t.Fatalf("ca.intermediate_ttl after the first start: %+v; want 4380h0m0s", s)
	}
	if s := got["ca.draft_ttl"]; s.Value != "1h0m0s" || s.Version != 1 {
		t.Fatalf("ca.draft_ttl, left to its default: %+v; want the default recorded", s)
	}

	// The second replica's file says otherwise: it refuses to start,
	// naming both values and both ways out.
	writeYAML(second, "signer:\n  min_lead_time: 5m\nca:\n  intermediate_ttl: 4380h\n")
	line := mustFail(t, "authority", "--data", second, "--store", url, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0")
	for _, want := range []string{"signer.min_lead_time is 5m0s in " + filepath.Join(second, "authority.yaml"), "but 2m0s in the store",
		"make it 2m0s there or leave it out", "`muster settings set signer.min_lead_time 5m0s`"} {
		if !strings.Contains(line, want) {
			t.Errorf("the refusal %q does not say %q", line, want)
		}
	}
	if strings.Contains(line, "ca.intermediate_ttl") {
		t.Errorf("the refusal names ca.intermediate_ttl, which agrees: %q", line)
	}
	if out := mustRun(t, "audit", "list", "--data", dir, "--action", "authority.start"); !strings.Contains(out, "shared settings: signer.min_lead_time is 5m0s") {
		t.Errorf("the refused start is not audited with its reason:\n%s", out)
	}
	// A flag counts as given too.
	writeYAML(second, "")
	line = mustFail(t, "authority", "--data", second, "--store", url, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--ca-intermediate-ttl", "720h")
	if !strings.Contains(line, "ca.intermediate_ttl is 720h0m0s in --ca-intermediate-ttl") || !strings.Contains(line, "but 4380h0m0s in the store") {
		t.Errorf("the refusal of a differing flag: %q", line)
	}

	// Left out of its file, the store's values hold on the second one.
	second2 := startAuthority(t, second, "--store", url)
	logsOnFailure(t, "replica 2", second2.Logs)
	leadThrough := func(d string) string {
		t.Helper()
		out := mustRun(t, "signer", "list", "--data", d)
		_, after, ok := strings.Cut(out, "minimum lead time ")
		if !ok {
			t.Fatalf("signer list prints no lead time:\n%s", out)
		}
		return strings.TrimSuffix(strings.TrimSpace(after), ".")
	}
	for _, d := range []string{dir, second} {
		if lead := leadThrough(d); lead != "2m0s" {
			t.Errorf("signer.min_lead_time in force through %s: %s, want the store's 2m0s", d, lead)
		}
	}

	// A value outside the bounds is refused and changes nothing.
	if line := mustFail(t, "settings", "set", "signer.min_lead_time", "10s", "--data", second); !strings.Contains(line, "want a duration between 1m0s and 168h0m0s") {
		t.Errorf("settings set of a value out of bounds: %q", line)
	}
	if line := mustFail(t, "settings", "set", "crl_validity", "1h", "--data", second); !strings.Contains(line, "not a shared setting") {
		t.Errorf("settings set of a key that is not shared: %q", line)
	}

	// Changed through the second replica, both use it, without a restart.
	if out := mustRun(t, "settings", "set", "signer.min_lead_time", "3m", "--data", second); !strings.Contains(out, "signer.min_lead_time is 3m0s for every replica (version 2)") {
		t.Errorf("settings set printed %q", out)
	}
	deadline := time.Now().Add(60 * time.Second)
	for leadThrough(dir) != "3m0s" {
		if time.Now().After(deadline) {
			t.Fatalf("replica 1 still uses signer.min_lead_time %s a minute after it was set to 3m through replica 2", leadThrough(dir))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if lead := leadThrough(second); lead != "3m0s" {
		t.Errorf("replica 2, which took the change, uses %s", lead)
	}
	if s := settings(dir)["signer.min_lead_time"]; s.Value != "3m0s" || s.Version != 2 || !strings.HasSuffix(s.UpdatedBy, "/admin/admin") {
		t.Errorf("signer.min_lead_time after settings set, read through replica 1: %+v", s)
	}
	// A signer staged through replica 1 is held to the new lead time.
	if line := mustFail(t, "signer", "stage", "--effective-in", "2m30s", "--data", dir); !strings.Contains(line, "less than the lead time 3m0s away") {
		t.Errorf("a stage below the new lead time through replica 1: %q", line)
	}
	out := mustRun(t, "audit", "list", "--data", dir, "--action", "setting.set")
	for _, want := range []string{"signer.min_lead_time recorded as 2m0s from this replica's settings", "signer.min_lead_time was 2m0s, now 3m0s for every replica"} {
		if !strings.Contains(out, want) {
			t.Errorf("audit list --action setting.set does not hold %q:\n%s", want, out)
		}
	}
	// The first replica, restarted with its file still saying 2m, now
	// refuses: the way out is the file.
	first.stop(t)
	if line := mustFail(t, "authority", "--data", dir, "--store", url, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"); !strings.Contains(line, "signer.min_lead_time is 2m0s in") || !strings.Contains(line, "but 3m0s in the store") {
		t.Errorf("replica 1 restarted with its old file: %q", line)
	}
}

// settingLine is one line of muster settings list -o json.
type settingLine struct {
	Key       string `json:"key"`
	Value     string `json:"value"`
	Version   int64  `json:"version"`
	UpdatedBy string `json:"updated_by"`
}

// leadIn is the signer.min_lead_time in force through the authority of
// data directory d, as signer list prints it.
func leadIn(t *testing.T, d string) string {
	t.Helper()
	out := mustRun(t, "signer", "list", "--data", d)
	_, after, ok := strings.Cut(out, "minimum lead time ")
	if !ok {
		t.Fatalf("signer list prints no lead time:\n%s", out)
	}
	return strings.TrimSuffix(strings.TrimSpace(after), ".")
}

// settingsOf is muster settings list -o json with args, by key.
func settingsOf(t *testing.T, args ...string) map[string]settingLine {
	t.Helper()
	var list []settingLine
	if err := json.Unmarshal([]byte(mustRun(t, append([]string{"settings", "list", "-o", "json"}, args...)...)), &list); err != nil {
		t.Fatal(err)
	}
	m := map[string]settingLine{}
	for _, s := range list {
		m[s.Key] = s
	}
	return m
}

func writeAuthorityYAML(t *testing.T, d, yaml string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(d, "authority.yaml"), []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestSharedSettingsFollowTheFileOnSQLite: the one authority on an
// SQLite store changes a shared setting by its authority.yaml and a
// restart, as any other setting: started with one value, stopped, the
// file changed, started again, it runs with the new value, which it
// records in the store (settings list), audits as setting.set naming
// both values and the file, and warns of. settings set --offline beside
// it, from another process, reaches it without a restart, is audited by
// its own actor, and says that the file's value comes back at the next
// start.
func TestSharedSettingsFollowTheFileOnSQLite(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	yaml := filepath.Join(dir, "authority.yaml")
	writeAuthorityYAML(t, dir, "signer:\n  min_lead_time: 2m\n")
	a := startAuthority(t, dir)
	if lead := leadIn(t, dir); lead != "2m0s" {
		t.Fatalf("signer.min_lead_time in force at the first start: %s, want 2m0s", lead)
	}
	a.stop(t)

	writeAuthorityYAML(t, dir, "signer:\n  min_lead_time: 5m\n")
	a = startAuthority(t, dir, "--ca-draft-ttl", "2h")
	logsOnFailure(t, "authority", a.Logs)
	if lead := leadIn(t, dir); lead != "5m0s" {
		t.Errorf("signer.min_lead_time in force after the file said 5m and a restart: %s", lead)
	}
	got := settingsOf(t, "--data", dir)
	if s := got["signer.min_lead_time"]; s.Value != "5m0s" || s.Version != 2 || s.UpdatedBy != "authority" {
		t.Errorf("signer.min_lead_time in the store after the restart: %+v; want 5m0s, version 2, by the authority", s)
	}
	if s := got["ca.draft_ttl"]; s.Value != "2h0m0s" || s.Version != 2 {
		t.Errorf("ca.draft_ttl in the store after a restart with --ca-draft-ttl 2h: %+v", s)
	}
	audit := mustRun(t, "audit", "list", "--data", dir, "--action", "setting.set")
	for _, want := range []string{"signer.min_lead_time was 2m0s in the store, now 5m0s from " + yaml,
		"ca.draft_ttl was 1h0m0s in the store, now 2h0m0s from --ca-draft-ttl"} {
		if !strings.Contains(audit, want) {
			t.Errorf("audit list --action setting.set does not hold %q:\n%s", want, audit)
		}
	}
	if logs := a.Logs(); !strings.Contains(logs, `"level":"WARN","msg":"shared setting changed in the store to this authority's value`) {
		t.Errorf("the authority did not warn that it changed the store's value:\n%s", logs)
	}

	// settings set --offline, from another process beside the running
	// authority: it uses the value within seconds, without a restart.
	out := mustRun(t, "settings", "set", "signer.min_lead_time", "7m", "--offline", "--data", dir)
	for _, want := range []string{"signer.min_lead_time is 7m0s in the store (version 3), written offline",
		yaml + " gives signer.min_lead_time 5m, which the authority's next start puts back in the store: make it 7m0s there or leave it out"} {
		if !strings.Contains(out, want) {
			t.Errorf("settings set --offline printed %q, want it to say %q", out, want)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for leadIn(t, dir) != "7m0s" {
		if time.Now().After(deadline) {
			t.Fatalf("the running authority still uses signer.min_lead_time %s a minute after settings set --offline made it 7m", leadIn(t, dir))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if s := settingsOf(t, "--offline", "--data", dir)["signer.min_lead_time"]; s.Value != "7m0s" || s.Version != 3 || s.UpdatedBy != "muster settings set --offline" {
		t.Errorf("settings list --offline after settings set --offline: %+v", s)
	}
	if audit := mustRun(t, "audit", "list", "--data", dir, "--action", "setting.set", "-o", "json"); !strings.Contains(audit, `"actor": "muster settings set --offline"`) ||
		!strings.Contains(audit, "signer.min_lead_time was 5m0s, now 7m0s for every replica (offline, from the data directory "+dir+")") {
		t.Errorf("settings set --offline is not audited with its actor and both values:\n%s", audit)
	}
	a.stop(t)
}

// TestSettingsSetOfflinePostgres: with every replica on a PostgreSQL
// store stopped, one whose authority.yaml gives a shared setting another
// value than the store's refuses to start, naming muster settings set
// KEY VALUE --offline --data DIR (DIR quoted: it holds a space); that
// command, pasted into a shell, changes the store's value, audited, and
// the replica then starts with it, while the other, whose file still
// gives the old value, refuses.
func TestSettingsSetOfflinePostgres(t *testing.T) {
	t.Parallel()
	url := postgres(t)
	dir := filepath.Join(t.TempDir(), "authority one")
	mustRun(t, "init", "--data", dir, "--store", url)
	other := replicaDir(t, dir)
	writeAuthorityYAML(t, other, "signer:\n  min_lead_time: 2m\n")
	startAuthority(t, other).stop(t)

	writeAuthorityYAML(t, dir, "signer:\n  min_lead_time: 5m\n")
	line := mustFail(t, "authority", "--data", dir, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0")
	want := "`muster settings set signer.min_lead_time 5m0s --offline --data " + shellword.Quote(dir) + "` (with none running)"
	if !strings.Contains(line, want) || !strings.Contains(line, "`muster settings set signer.min_lead_time 5m0s` (through a running replica)") {
		t.Fatalf("the refusal %q does not name both ways out (want %q)", line, want)
	}
	pasted := strings.TrimPrefix(strings.TrimSuffix(want, "` (with none running)"), "`muster ")
	out, err := exec.Command("sh", "-c", shellword.Quote(musterBin)+" "+pasted).CombinedOutput()
	if err != nil {
		t.Fatalf("the pasted way out, muster %s: %v\n%s", pasted, err, out)
	}
	if !strings.Contains(string(out), "signer.min_lead_time is 5m0s in the store (version 2), written offline") {
		t.Errorf("settings set --offline printed %q", out)
	}
	if s := settingsOf(t, "--offline", "--data", other)["signer.min_lead_time"]; s.Value != "5m0s" || s.Version != 2 {
		t.Errorf("settings list --offline through the other replica's directory: %+v", s)
	}

	a := startAuthority(t, dir)
	logsOnFailure(t, "replica", a.Logs)
	if lead := leadIn(t, dir); lead != "5m0s" {
		t.Errorf("signer.min_lead_time in force on the replica started after settings set --offline: %s", lead)
	}
	if audit := mustRun(t, "audit", "list", "--data", dir, "--action", "setting.set", "-o", "json"); !strings.Contains(audit, `"actor": "muster settings set --offline"`) ||
		!strings.Contains(audit, "signer.min_lead_time was 2m0s, now 5m0s for every replica") {
		t.Errorf("settings set --offline is not audited:\n%s", audit)
	}
	if line := mustFail(t, "authority", "--data", other, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"); !strings.Contains(line, "signer.min_lead_time is 2m0s in") ||
		!strings.Contains(line, "but 5m0s in the store") {
		t.Errorf("the replica whose file still says 2m: %q", line)
	}
	a.stop(t)
}

// TestSettingsSetOfflineConfigFile: a replica started with --config FILE
// outside its data directory, the store URL only there (as the packaged
// unit keeps it in /etc/muster/authority.yaml) and authority.json's no
// use, refuses a differing value with an offline way out that names
// --config FILE; pasted, it changes the value in that store, and the
// replica then starts.
func TestSettingsSetOfflineConfigFile(t *testing.T) {
	t.Parallel()
	url := postgres(t)
	dir := filepath.Join(t.TempDir(), "authority one")
	mustRun(t, "init", "--data", dir, "--store", url)
	other := replicaDir(t, dir)
	writeAuthorityYAML(t, other, "signer:\n  min_lead_time: 2m\n")
	startAuthority(t, other).stop(t)

	// authority.json records the store without its user: only the
	// settings file gives it.
	info := filepath.Join(dir, "authority.json")
	raw, err := os.ReadFile(info)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	m["store"] = "postgres://…@127.0.0.1:1/muster"
	if raw, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(info, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "etc muster", "authority.yaml")
	if err := os.MkdirAll(filepath.Dir(cfg), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, []byte("store: "+url+"\nsigner:\n  min_lead_time: 5m\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	line := mustFail(t, "authority", "--data", dir, "--config", cfg, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0")
	want := "`muster settings set signer.min_lead_time 5m0s --offline --data " + shellword.Quote(dir) + " --config " + shellword.Quote(cfg) + "` (with none running)"
	if !strings.Contains(line, want) {
		t.Fatalf("the refusal %q does not name the offline way out with --config (want %q)", line, want)
	}
	pasted := strings.TrimPrefix(strings.TrimSuffix(want, "` (with none running)"), "`muster ")
	out, err := exec.Command("sh", "-c", shellword.Quote(musterBin)+" "+pasted).CombinedOutput()
	if err != nil {
		t.Fatalf("the pasted way out, muster %s: %v\n%s", pasted, err, out)
	}
	if s := settingsOf(t, "--offline", "--data", other)["signer.min_lead_time"]; s.Value != "5m0s" || s.Version != 2 {
		t.Errorf("settings list --offline through the other replica's directory: %+v", s)
	}
	a := startAuthority(t, dir, "--config", cfg)
	logsOnFailure(t, "replica", a.Logs)
	a.stop(t)
}
