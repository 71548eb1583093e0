package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
