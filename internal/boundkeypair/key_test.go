package boundkeypair

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
)

// A key ssh-keygen -t ed25519 made, and its fingerprint as ssh-keygen -l
// printed it.
const (
	sshKey         = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMMc0++aSjWN12HG1btq+ZjO1gwJpQUmDaWmRNXxKUbx"
	sshFingerprint = "SHA256:EUqFONGB3xixgPlwkgVbEdvaYtPQiAa7+5EkmsWlwrI"
)

func TestParsePublicKey(t *testing.T) {
	k, err := ParsePublicKey(sshKey + " bot@host")
	if err != nil {
		t.Fatal(err)
	}
	if k.String() != sshKey {
		t.Errorf("String = %q, want the comment dropped", k.String())
	}
	round, err := ParsePublicKey(k.String())
	if err != nil || !round.Equal(k) {
		t.Errorf("round trip: %v", err)
	}
	for name, text := range map[string]string{
		"empty":         "",
		"rsa":           "ssh-rsa " + strings.Fields(sshKey)[1],
		"no key":        "ssh-ed25519",
		"not base64":    "ssh-ed25519 !!!",
		"wrong inside":  "ssh-ed25519 AAAAB3NzaC1yc2EAAAADAQABAAABAQ==",
		"truncated":     "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGb4jRBFw2nQ",
		"too long text": "ssh-ed25519 " + strings.Repeat("A", maxKeyText),
	} {
		if _, err := ParsePublicKey(text); !errors.Is(err, ErrMalformedKey) {
			t.Errorf("%s: err = %v, want ErrMalformedKey", name, err)
		}
	}
}

func TestFingerprintIsOpenSSHs(t *testing.T) {
	k, err := ParsePublicKey(sshKey)
	if err != nil {
		t.Fatal(err)
	}
	if got := k.Fingerprint(); got != sshFingerprint {
		t.Errorf("Fingerprint = %s, want %s", got, sshFingerprint)
	}
}

func TestNewPublicKey(t *testing.T) {
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	k, err := NewPublicKey(pub)
	if err != nil || !k.Ed25519().Equal(pub) {
		t.Fatalf("NewPublicKey: %v", err)
	}
	if _, err := NewPublicKey(pub[:31]); err == nil {
		t.Error("a 31-byte key was accepted")
	}
}

func FuzzParsePublicKey(f *testing.F) {
	f.Add(sshKey)
	f.Add(sshKey + " comment")
	f.Add("ssh-ed25519 AAAA")
	f.Fuzz(func(t *testing.T, text string) {
		k, err := ParsePublicKey(text)
		if err != nil {
			return
		}
		again, err := ParsePublicKey(k.String())
		if err != nil || !again.Equal(k) || again.Fingerprint() != k.Fingerprint() {
			t.Fatalf("canonical form %q does not round-trip: %v", k.String(), err)
		}
	})
}
