package datadir

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
)

func TestLockRefusesASecondHolder(t *testing.T) {
	d := Dir(t.TempDir())
	release, err := d.Lock()
	if err != nil {
		t.Fatal(err)
	}
	// flock(2) locks belong to the open file, so a second open in this
	// process stands in for a second authority process.
	_, err = d.Lock()
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second Lock = %v, want ErrLocked", err)
	}
	if want := fmt.Sprintf("pid %d", os.Getpid()); !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), string(d)) {
		t.Errorf("second Lock = %q, want the holder's %s and the directory", err, want)
	}
	release()
	again, err := d.Lock()
	if err != nil {
		t.Fatalf("Lock after release = %v", err)
	}
	again()
	if fi, err := os.Stat(d.LockFile()); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("lock file: %v %v, want 0600", fi, err)
	}
}

func TestLockNeedsTheDirectory(t *testing.T) {
	d := Dir(t.TempDir() + "/missing")
	if _, err := d.Lock(); err == nil || errors.Is(err, ErrLocked) {
		t.Fatalf("Lock on a missing directory = %v, want an open error", err)
	}
}
