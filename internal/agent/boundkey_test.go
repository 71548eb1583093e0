package agent

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
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
