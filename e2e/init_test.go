package e2e

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("%s: no PEM block", path)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c
}

func TestInitCreatesTheHierarchy(t *testing.T) {
	t.Parallel()
	dir, out := initDir(t, "--name", "prod")
	root := readCert(t, filepath.Join(dir, "ca", "root.crt"))

	sum := sha256.Sum256(root.RawSubjectPublicKeyInfo)
	wantFP := "sha256:" + hex.EncodeToString(sum[:])
	if out["ca_fingerprint"] != wantFP {
		t.Errorf("ca_fingerprint = %v, want %s (sha256 of the root SPKI)", out["ca_fingerprint"], wantFP)
	}
	if want := "prod-" + wantFP[7:13]; out["authority_id"] != want {
		t.Errorf("authority_id = %v, want %s", out["authority_id"], want)
	}
	if !regexp.MustCompile(`^muster-psk:[0-9a-f]{64}$`).MatchString(out["bootstrap_psk"].(string)) {
		t.Errorf("bootstrap_psk %q is not muster-psk: + 64 hex", out["bootstrap_psk"])
	}

	roots := x509.NewCertPool()
	roots.AddCert(root)
	for _, tc := range []struct {
		name  string
		isCA  bool
		usage x509.ExtKeyUsage
	}{
		{"bootstrap", true, x509.ExtKeyUsageServerAuth},
		{"server", true, x509.ExtKeyUsageServerAuth},
		{"agent", true, x509.ExtKeyUsageClientAuth},
		{"admin", true, x509.ExtKeyUsageClientAuth},
		{"policy", false, x509.ExtKeyUsageAny},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := readCert(t, filepath.Join(dir, "ca", tc.name+".crt"))
			if _, err := c.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{tc.usage}}); err != nil {
				t.Errorf("does not verify against the root: %v", err)
			}
			if c.IsCA != tc.isCA {
				t.Errorf("IsCA = %v, want %v", c.IsCA, tc.isCA)
			}
			if tc.isCA && (c.MaxPathLen != 0 || !c.MaxPathLenZero) {
				t.Errorf("intermediate path length = %d (zero %v), want 0", c.MaxPathLen, c.MaxPathLenZero)
			}
		})
	}

	// Every key file 0600, every directory 0700.
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		fi, _ := d.Info()
		perm := fi.Mode().Perm()
		switch {
		case d.IsDir() && perm != 0o700:
			t.Errorf("%s: mode %v, want 0700", path, perm)
		case strings.HasSuffix(path, ".key") || strings.HasSuffix(path, ".pem") || strings.HasSuffix(path, ".db"):
			if perm != 0o600 {
				t.Errorf("%s: mode %v, want 0600", path, perm)
			}
		}
		return nil
	})
}

func TestInitKeepsThePSKEncrypted(t *testing.T) {
	t.Parallel()
	dir, out := initDir(t)
	secret := strings.TrimPrefix(out["bootstrap_psk"].(string), "muster-psk:")
	raw, _ := hex.DecodeString(secret)
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		if d.IsDir() {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(data, []byte(secret)) || bytes.Contains(data, raw) {
			t.Errorf("%s holds the PSK in plaintext", path)
		}
		return nil
	})
}

// snapshot maps every file under dir to its content and mode.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, _ := d.Info()
		if d.IsDir() {
			m[path] = fi.Mode().String()
			return nil
		}
		data, _ := os.ReadFile(path)
		sum := sha256.Sum256(data)
		m[path] = fi.Mode().String() + hex.EncodeToString(sum[:])
		return nil
	})
	return m
}

func TestInitRefusals(t *testing.T) {
	t.Parallel()
	t.Run("already initialised", func(t *testing.T) {
		dir, _ := initDir(t)
		before := snapshot(t, dir)
		line := mustFail(t, "init", "--data", dir)
		if !strings.Contains(line, "already") {
			t.Errorf("refusal %q does not say the directory is already initialised", line)
		}
		if after := snapshot(t, dir); !equalMaps(before, after) {
			t.Error("re-init changed files")
		}
	})
	t.Run("not empty", func(t *testing.T) {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("mine"), 0o644)
		line := mustFail(t, "init", "--data", dir)
		if !strings.Contains(line, "not empty") {
			t.Errorf("refusal %q does not say the directory is not empty", line)
		}
		entries, _ := os.ReadDir(dir)
		if len(entries) != 1 {
			t.Errorf("refused init left %d entries, want only notes.txt", len(entries))
		}
	})
	t.Run("unwritable", func(t *testing.T) {
		// A path below a regular file cannot be created, even by root.
		file := filepath.Join(t.TempDir(), "file")
		os.WriteFile(file, nil, 0o600)
		mustFail(t, "init", "--data", filepath.Join(file, "authority"))
	})
	t.Run("bad name", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "a")
		mustFail(t, "init", "--data", dir, "--name", "Not_Valid")
		if _, err := os.Stat(dir); err == nil {
			t.Error("a refused init created the directory")
		}
	})
	t.Run("no leftovers", func(t *testing.T) {
		parent := t.TempDir()
		file := filepath.Join(parent, "taken")
		os.WriteFile(file, []byte("x"), 0o600)
		mustFail(t, "init", "--data", file)
		entries, _ := os.ReadDir(parent)
		if len(entries) != 1 {
			t.Errorf("refused init left staging files: %v", entries)
		}
	})
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
