package datadir

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Init fills an existing empty directory in place (systemd's
// StateDirectory=, a Kubernetes volume), made 0700, and still refuses a
// non-empty or initialised one.
func TestInitExistingDirectory(t *testing.T) {
	ctx := context.Background()
	init := func(dir string) error {
		_, err := Init(ctx, InitOptions{Dir: Dir(dir), Name: "test", Now: time.Now()})
		return err
	}
	parent := t.TempDir()
	empty := filepath.Join(parent, "state")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := init(empty); err != nil {
		t.Fatalf("Init on an empty directory: %v", err)
	}
	if _, err := Dir(empty).ReadInfo(); err != nil {
		t.Fatalf("ReadInfo after Init: %v", err)
	}
	if fi, _ := os.Stat(empty); fi.Mode().Perm() != 0o700 {
		t.Errorf("mode %v, want 0700", fi.Mode().Perm())
	}
	entries, _ := os.ReadDir(empty)
	for _, e := range entries {
		if strings.Contains(e.Name(), ".init-") {
			t.Errorf("staging %s left behind", e.Name())
		}
	}
	if left, _ := os.ReadDir(parent); len(left) != 1 {
		t.Errorf("parent holds %d entries, want only the data directory", len(left))
	}
	if err := init(empty); !errors.Is(err, ErrAlreadyInitialised) {
		t.Errorf("second Init = %v, want ErrAlreadyInitialised", err)
	}

	full := filepath.Join(parent, "full")
	os.Mkdir(full, 0o700)
	os.WriteFile(filepath.Join(full, "notes"), []byte("x"), 0o600)
	if err := init(full); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Errorf("Init on a non-empty directory = %v, want a refusal", err)
	}
	if entries, _ := os.ReadDir(full); len(entries) != 1 {
		t.Errorf("refused Init changed the directory: %d entries", len(entries))
	}
}

// A name that appears in the target while Init builds (a racing init) is
// never replaced, and what was moved goes back.
func TestMoveIntoRefusesAnExistingName(t *testing.T) {
	target := t.TempDir()
	staging := filepath.Join(target, ".x.init-1")
	os.Mkdir(staging, 0o700)
	for _, n := range []string{"a", "authority.json", "z"} {
		os.WriteFile(filepath.Join(staging, n), []byte("new"), 0o600)
	}
	os.WriteFile(filepath.Join(target, "z"), []byte("theirs"), 0o600)
	if err := moveInto(staging, target); err == nil {
		t.Fatal("moveInto replaced an existing name")
	}
	if b, _ := os.ReadFile(filepath.Join(target, "z")); string(b) != "theirs" {
		t.Errorf("z = %q, want it kept", b)
	}
	for _, n := range []string{"a", "authority.json"} {
		if _, err := os.Stat(filepath.Join(target, n)); err == nil {
			t.Errorf("%s left in the target after a failed move", n)
		}
	}
}
