package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRootKeyExportAfterRotation: after a root rotation reaches standby,
// muster ca root export-key writes the new root's key to a 0600 file and
// takes it from the authority (audited): muster ca status says the root
// key is offline, preparing an intermediate without --root-key is refused,
// a second export is refused, and muster ca rotate ROLE --root-key FILE
// prepares a successor signed with the exported key. Break-glass still
// finds the exported root. The next root rotation's refusals (no key, the
// data directory's ca/root.key) name the exported file, as does a
// rollback to update_agents, which the exported key cannot serve.
func TestRootKeyExportAfterRotation(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	startAuthority(t, dir)
	keyFile := filepath.Join(t.TempDir(), "root.key")
	if msg := mustFail(t, "ca", "root", "export-key", "--data", dir, "--out", keyFile); !strings.Contains(msg, "no finished root rotation") {
		t.Fatalf("export-key with no rotation: %s", msg)
	}
	newFP := caRoot(t, dir, "rotate").NewRoot.Fingerprint
	caRoot(t, dir, "next-phase")
	caRoot(t, dir, "next-phase")
	mustRun(t, "admin", "renew", "--data", dir)
	if st := caRoot(t, dir, "next-phase"); st.Phase != "standby" {
		t.Fatalf("after three next-phase: %+v", st)
	}

	// A key file that cannot be written is audited too (an error).
	if msg := mustFail(t, "ca", "root", "export-key", "--data", dir, "--out", filepath.Join(t.TempDir(), "no-such-dir", "root.key")); !strings.Contains(msg, "writing") {
		t.Fatalf("an export to a missing directory: %s", msg)
	}

	var exported struct {
		Fingerprint string `json:"root_fingerprint"`
		KeyFile     string `json:"key_file"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "ca", "root", "export-key", "--data", dir, "--out", keyFile, "-o", "json")), &exported); err != nil {
		t.Fatal(err)
	}
	if exported.Fingerprint != newFP || exported.KeyFile != keyFile {
		t.Fatalf("export-key printed %+v; want the new root %s and %s", exported, newFP, keyFile)
	}
	fi, err := os.Stat(keyFile)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the exported key file: %v %v; want mode 0600", fi, err)
	}
	if b, _ := os.ReadFile(keyFile); !strings.Contains(string(b), "PRIVATE KEY") {
		t.Fatalf("the exported key file holds %q", b)
	}
	if msg := mustFail(t, "ca", "root", "export-key", "--data", dir, "--out", filepath.Join(t.TempDir(), "again.key")); !strings.Contains(msg, "exported before") {
		t.Fatalf("a second export: %s", msg)
	}
	if msg := mustFail(t, "ca", "root", "export-key", "--data", dir, "--out", keyFile); !strings.Contains(msg, "already exists") {
		t.Fatalf("an export over an existing file: %s", msg)
	}

	// The authority reads the change within its periodic re-read.
	waitFor(t, 15*time.Second, "ca status says the root key is offline", func() bool {
		var st struct {
			RootKey string `json:"root_key"`
		}
		return json.Unmarshal([]byte(mustRun(t, "ca", "status", "--data", dir, "-o", "json")), &st) == nil && st.RootKey == "offline"
	})
	if msg := mustFail(t, "ca", "rotate", "agent", "--data", dir); !strings.Contains(msg, "--root-key FILE") {
		t.Fatalf("ca rotate without the root key after the export: %s", msg)
	}
	out := mustRun(t, "ca", "rotate", "agent", "--root-key", keyFile, "--data", dir, "-o", "json")
	if !strings.Contains(out, "prepared") {
		t.Fatalf("ca rotate agent --root-key with the exported key: %s", out)
	}

	recs := auditOf(t, dir, "ca.root_export_key")
	var ok, denied, failed int
	for _, r := range recs {
		switch {
		case r.Result == "ok" && r.Target == newFP && strings.Contains(r.Reason, keyFile):
			ok++
		case r.Result == "denied":
			denied++
		case r.Result == "error" && r.Target == newFP && strings.Contains(r.Reason, "no-such-dir"):
			failed++
		}
	}
	if ok != 1 || denied < 2 || failed != 1 {
		t.Fatalf("ca.root_export_key records %+v; want one success naming the file and the refusals", recs)
	}

	// Break-glass finds the exported root through its cross-certificate.
	carol := filepath.Join(t.TempDir(), "carol.pem")
	mustRun(t, "admin", "add", "carol", "--offline", "--data", dir, "--out", carol)

	// The next root rotation needs the exported key, and its refusals say
	// so: not ca/root.key, which holds the key of the root muster init
	// made, no longer current.
	for _, args := range [][]string{{}, {"--root-key", filepath.Join(dir, "ca", "root.key")}} {
		msg := mustFail(t, append([]string{"ca", "root", "rotate", "--data", dir}, args...)...)
		if !strings.Contains(msg, "muster ca root export-key wrote") || strings.Contains(msg, "muster init wrote it as ca/root.key") {
			t.Fatalf("ca root rotate %v after the export: %s; want it to name the exported key's file", args, msg)
		}
	}
	if st := caRoot(t, dir, "rotate", "--root-key", keyFile); st.Phase != "init" {
		t.Fatalf("ca root rotate --root-key with the exported key: %+v", st)
	}
	caRoot(t, dir, "next-phase")
	caRoot(t, dir, "next-phase")
	// Rolling back to update_agents would sign with the exported root
	// again: refused, without sending the operator to ca/root.key.
	msg := mustFail(t, "ca", "root", "rollback", "--data", dir)
	if !strings.Contains(msg, "muster ca root export-key") || !strings.Contains(msg, "muster ca root next-phase") || strings.Contains(msg, "put it back") {
		t.Fatalf("rollback to update_agents with the old root's key exported: %s", msg)
	}
}
