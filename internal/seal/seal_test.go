package seal

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// RFC 5869 test case 3 (SHA-256, no salt, no info) pins the KDF to the
// standard, so a stored secret stays readable across Go versions.
func TestHKDFVector(t *testing.T) {
	ikm := bytes.Repeat([]byte{0x0b}, 22)
	got, err := hkdf.Key(sha256.New, ikm, nil, "", 42)
	if err != nil {
		t.Fatal(err)
	}
	want := "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8"
	if hex.EncodeToString(got) != want {
		t.Fatalf("HKDF = %x, want %s", got, want)
	}
}

func newKey(t *testing.T) StorageKey {
	t.Helper()
	root, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	k, err := DeriveStorageKey(root)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestDeriveStorageKeyIsDeterministic(t *testing.T) {
	root, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	a, _ := DeriveStorageKey(root)
	b, _ := DeriveStorageKey(root)
	if a != b {
		t.Fatal("the same root key gave two storage keys")
	}
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	c, _ := DeriveStorageKey(other)
	if a == c {
		t.Fatal("two root keys gave one storage key")
	}
	if _, err := DeriveStorageKey(nil); err == nil {
		t.Fatal("nil root key accepted")
	}
}

func TestPurposesAreSeparate(t *testing.T) {
	k := newKey(t)
	if bytes.Equal(k.Derive(InfoPSK, 32), k.Derive(InfoToken, 32)) {
		t.Fatal("two purposes derived one key")
	}
}

func TestSealOpen(t *testing.T) {
	k := newKey(t)
	psk, _ := k.Sealer(InfoPSK)
	tok, _ := k.Sealer(InfoToken)
	other, _ := newKey(t).Sealer(InfoPSK)

	ct, nonce, err := psk.Seal([]byte("secret"), []byte("row-1"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(ct, []byte("secret")) {
		t.Fatal("ciphertext holds the plaintext")
	}
	pt, err := psk.Open(ct, nonce, []byte("row-1"))
	if err != nil || string(pt) != "secret" {
		t.Fatalf("Open = %q, %v", pt, err)
	}
	flipped := bytes.Clone(ct)
	flipped[0] ^= 1
	tests := []struct {
		name      string
		s         *Sealer
		ct, nonce []byte
		aad       string
	}{
		{"other row", psk, ct, nonce, "row-2"},
		{"other purpose", tok, ct, nonce, "row-1"},
		{"other storage key", other, ct, nonce, "row-1"},
		{"flipped bit", psk, flipped, nonce, "row-1"},
		{"short nonce", psk, ct, nonce[:4], "row-1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := tt.s.Open(tt.ct, tt.nonce, []byte(tt.aad)); !errors.Is(err, ErrDecrypt) {
				t.Fatalf("Open = %v, want ErrDecrypt", err)
			}
		})
	}
	if _, err := k.Sealer(""); err == nil {
		t.Fatal("empty purpose accepted")
	}
}

func TestFileRoundTrip(t *testing.T) {
	k := newKey(t)
	path := filepath.Join(t.TempDir(), "storage.key")
	if err := k.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(path)
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %o, want 600", fi.Mode().Perm())
	}
	got, err := LoadStorageKey(path)
	if err != nil || got != k {
		t.Fatalf("LoadStorageKey = %v, %v", got, err)
	}
	if err := newKey(t).WriteFile(path); err == nil {
		t.Fatal("WriteFile replaced an existing key")
	}
	if again, _ := LoadStorageKey(path); again != k {
		t.Fatal("existing key changed")
	}
}

func TestLoadRefusals(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
		return p
	}
	good := strings.Repeat("ab", 32) + "\n"
	tests := []struct {
		name, path, want string
	}{
		{"readable by others", write("a", good, 0o644), "accessible by other users"},
		{"not hex", write("b", strings.Repeat("zz", 32), 0o600), "corrupt"},
		{"short", write("c", "abcd", 0o600), "corrupt"},
		{"missing", filepath.Join(dir, "none"), "no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadStorageKey(tt.path)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestKeyIsRedacted(t *testing.T) {
	k := newKey(t)
	for _, s := range []string{fmt.Sprint(k), fmt.Sprintf("%v %s %#v", k, k, k)} {
		if strings.Contains(s, hex.EncodeToString(k[:4])) || !strings.Contains(s, "REDACTED") {
			t.Fatalf("key printed: %s", s)
		}
	}
}
