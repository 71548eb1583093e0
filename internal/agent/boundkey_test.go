package agent

import (
	"crypto/ed25519"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/muster-dev/muster/internal/boundkeypair"
)

func TestCreateBoundKey(t *testing.T) {
	d := Dir(filepath.Join(t.TempDir(), "a"))
	pub, err := CreateBoundKey(d)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(d.BoundKeyFile())
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("bound key file: %v, mode %v", err, fi.Mode())
	}
	priv, err := LoadBoundKey(d)
	if err != nil {
		t.Fatal(err)
	}
	if !pub.Ed25519().Equal(priv.Public()) {
		t.Fatal("the loaded key is not the one created")
	}
	if _, err := CreateBoundKey(d); !errors.Is(err, ErrBoundKeyExists) {
		t.Fatalf("second CreateBoundKey = %v, want ErrBoundKeyExists", err)
	}
	again, _ := LoadBoundKey(d)
	if !again.Equal(priv) {
		t.Fatal("a refused CreateBoundKey replaced the key")
	}
}

// TestSettleBoundKey: the pending key of a rotation is written 0600 before
// it is sent; it replaces keys/bound.key only when the authority names it
// as bound, and is discarded otherwise, leaving the old key.
func TestSettleBoundKey(t *testing.T) {
	for _, tc := range []struct {
		name  string
		bound func(old, next boundkeypair.PublicKey) string
		swap  bool
	}{
		{"the authority bound the pending key", func(_, next boundkeypair.PublicKey) string { return next.Fingerprint() }, true},
		{"the authority kept the old key", func(old, _ boundkeypair.PublicKey) string { return old.Fingerprint() }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Dir(filepath.Join(t.TempDir(), "a"))
			old, err := CreateBoundKey(d)
			if err != nil {
				t.Fatal(err)
			}
			a := newTestAgent(t, d)
			next, err := a.newPendingBoundKey()
			if err != nil {
				t.Fatal(err)
			}
			if fi, err := os.Stat(d.NextBoundKeyFile()); err != nil || fi.Mode().Perm() != 0o600 {
				t.Fatalf("pending key file: %v %v", fi, err)
			}
			if got, err := a.pendingBoundKey(); err != nil || !got.Equal(next) {
				t.Fatalf("pending key read back: %v", err)
			}
			nextPub, _ := boundkeypair.NewPublicKey(next.Public().(ed25519.PublicKey))
			if err := a.settleBoundKey(next, tc.bound(old, nextPub)); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(d.NextBoundKeyFile()); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("a pending key is left: %v", err)
			}
			held, err := LoadBoundKey(d)
			if err != nil {
				t.Fatal(err)
			}
			if want := map[bool]ed25519.PublicKey{true: nextPub.Ed25519(), false: old.Ed25519()}[tc.swap]; !want.Equal(held.Public()) {
				t.Fatalf("keys/bound.key is not the %s key", map[bool]string{true: "new", false: "old"}[tc.swap])
			}
		})
	}
}
