package agent

import (
	"github.com/muster-dev/muster/internal/identity"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/muster-dev/muster/internal/ca"
)

func TestWriteFiles(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	if err := writeFiles(file{a, []byte("A1"), 0o644}, file{b, []byte("B1"), 0o600}); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]os.FileMode{a: 0o644, b: 0o600} {
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: %v, mode %v, want %v", path, err, fi.Mode().Perm(), want)
		}
	}
	// A file that cannot be written changes none of them.
	bad := filepath.Join(dir, "missing", "c")
	if err := writeFiles(file{a, []byte("A2"), 0o644}, file{bad, []byte("C"), 0o600}); err == nil {
		t.Fatal("writing into a missing directory succeeded")
	}
	if got, _ := os.ReadFile(a); string(got) != "A1" {
		t.Errorf("a = %q after a failed write, want A1", got)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.Contains(e.Name(), ".tmp-") {
			t.Errorf("temporary file %s left behind", e.Name())
		}
	}
}

// TestDirectoryLayout checks DESIGN.md's layout and modes after a join.
func TestDirectoryLayout(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	_, dir := joined(t, f)
	want := map[string]os.FileMode{
		string(dir):              0o700,
		dir.path("certs"):        0o700,
		dir.path("keys"):         0o700,
		dir.ConfigFile():         0o600,
		dir.StateFile():          0o600,
		dir.CertFile():           0o644,
		dir.CAFile():             0o644,
		dir.BundleFile():         0o644,
		dir.KeyFile():            0o600,
		dir.PKCS12File():         0o600,
		dir.PKCS12PasswordFile(): 0o600,
	}
	for path, mode := range want {
		fi, err := os.Stat(path)
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		if fi.Mode().Perm() != mode {
			t.Errorf("%s: mode %v, want %v", path, fi.Mode().Perm(), mode)
		}
	}
	// Nothing else: no temporary files, no pending key.
	filepath.WalkDir(string(dir), func(p string, d os.DirEntry, err error) error {
		if _, ok := want[p]; !ok && err == nil {
			t.Errorf("unexpected %s", p)
		}
		return nil
	})
	// agent.crt is the leaf and its intermediate; ca.crt the root alone.
	chain, _ := os.ReadFile(dir.CertFile())
	roots, _ := os.ReadFile(dir.CAFile())
	if c, _ := ca.ParseCertsPEM(chain); len(c) != 2 || c[0].IsCA || !c[1].IsCA {
		t.Errorf("agent.crt holds %d certificates", len(c))
	}
	if c, _ := ca.ParseCertsPEM(roots); len(c) != 1 || !c[0].Equal(f.h.Root) {
		t.Error("ca.crt is not the root")
	}
}

func TestPendingKey(t *testing.T) {
	dir := Dir(t.TempDir())
	if k, err := dir.pendingKey(false); k != nil || err != nil {
		t.Fatalf("pendingKey(false) on an empty directory: %v, %v", k, err)
	}
	k1, err := dir.pendingKey(true)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir.PendingKeyFile()); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("pending key file: %v", err)
	}
	k2, err := dir.pendingKey(true)
	if err != nil || !identity.SamePublicKey(k1.Public(), k2.Public()) {
		t.Fatal("a second call made a new key instead of reusing the pending one")
	}
	os.WriteFile(dir.PendingKeyFile(), []byte("junk"), 0o600)
	if _, err := dir.pendingKey(true); err == nil {
		t.Fatal("a corrupt pending key was accepted")
	}
}

// TestInterruptedRenewal: a crash after the new certificate was renamed
// into place but before its key leaves the key in keys/pending.key; the
// next load uses it and finishes the write.
func TestInterruptedRenewal(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	a, dir := joined(t, f)
	oldKey, _ := os.ReadFile(dir.KeyFile())
	if _, err := a.Renew(t.Context()); err != nil {
		t.Fatal(err)
	}
	newKey, _ := os.ReadFile(dir.KeyFile())
	// Put the crash back: the old key in certs/, the new one pending.
	os.WriteFile(dir.PendingKeyFile(), newKey, 0o600)
	os.WriteFile(dir.KeyFile(), oldKey, 0o600)

	id, err := dir.LoadIdentity()
	if err != nil {
		t.Fatalf("load after an interrupted renewal: %v", err)
	}
	if !identity.SamePublicKey(id.Key.Public(), id.Leaf().PublicKey) {
		t.Fatal("loaded key does not match the certificate")
	}
	if _, _, err := a.load(true); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(dir.KeyFile()); string(got) != string(newKey) {
		t.Error("agent.key was not repaired")
	}
	if _, err := os.Stat(dir.PendingKeyFile()); !os.IsNotExist(err) {
		t.Error("the pending key, now certified, was left behind")
	}
	if !dir.keystoreHolds(id.Leaf()) {
		t.Error("the keystore was not repaired")
	}
	// Renewal goes on from there.
	if st, err := a.Renew(t.Context()); err != nil || st.Generation != 2 {
		t.Fatalf("renewal after repair: %v", err)
	}
}

func TestConfig(t *testing.T) {
	dir := Dir(t.TempDir())
	if c, err := dir.ReadConfig(); err != nil || c != (Config{}) {
		t.Fatalf("missing agent.yaml: %+v, %v", c, err)
	}
	want := Config{Authority: "a:1", Node: "n1", JoinMethod: "token", Token: "abcdef.0123456789abcdef"}
	if err := dir.WriteConfig(want); err != nil {
		t.Fatal(err)
	}
	if got, err := dir.ReadConfig(); err != nil || got != want {
		t.Fatalf("read back %+v, %v", got, err)
	}
	os.WriteFile(dir.ConfigFile(), []byte("tokn: abcdef.0123456789abcdef\n"), 0o600)
	_, err := dir.ReadConfig()
	if err == nil || strings.Contains(err.Error(), "0123456789abcdef") {
		t.Fatalf("misspelt key: %v (must fail without quoting the secret)", err)
	}
}
