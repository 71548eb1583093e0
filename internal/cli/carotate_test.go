package cli

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/muster-dev/muster/internal/ca"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestCARotateSignsTheDraftWithTheRootKeyFile: the root key file is read
// only at mode 0600, signs only a draft of its own root, and the
// certificate it signs is what the authority checks for (ca.CheckSuccessor).
func TestCARotateSignsTheDraftWithTheRootKeyFile(t *testing.T) {
	now := time.Now()
	h, err := ca.Create("rot", now)
	if err != nil {
		t.Fatal(err)
	}
	other, err := ca.Create("other", now)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, h *ca.Hierarchy, mode os.FileMode) string {
		b, err := ca.EncodeKeyPEM(h.RootKey)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if _, err := readRootKey(write("open.key", h, 0o644)); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a root key others can read: %v", err)
	}
	key, err := readRootKey(write("root.key", h, 0o600))
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := ca.NewSerial()
	pub := other.Issuers[ca.RoleAgent].Cert.PublicKey // any P-256 key
	d, err := h.Draft(ca.RoleAgent, serial, pub, h.Root, now, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pubDER, _ := x509.MarshalPKIXPublicKey(pub)
	resp := &musterv1.DraftCAIntermediateResponse{Role: "agent", Serial: serial.Text(16), PublicKeyDer: pubDER,
		RawSubject: d.RawSubject, NotBefore: timestamppb.New(d.NotBefore), NotAfter: timestamppb.New(d.NotAfter), RootDer: h.Root.Raw}
	cert, err := signDraft(resp, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.CheckSuccessor(ca.RoleAgent, serial, pub, cert, h.Root, now); err != nil {
		t.Fatalf("the authority would refuse what the CLI signed: %v", err)
	}
	otherKey, err := readRootKey(write("other.key", other, 0o600))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := signDraft(resp, otherKey); err == nil || !strings.Contains(err.Error(), "is not this authority's root key") {
		t.Fatalf("another authority's root key: %v", err)
	}
}
