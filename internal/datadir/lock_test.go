package datadir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
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

// TestLockSQLiteStoreRefusesASecondHolder: the SQLite store's lock is
// held once, whatever name the file is given (a symbolic link), names
// the holder and the way out, and is taken again once released.
func TestLockSQLiteStoreRefusesASecondHolder(t *testing.T) {
	base := t.TempDir()
	db := filepath.Join(base, "muster.db")
	if err := os.WriteFile(db, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "other-name.db")
	if err := os.Symlink(db, link); err != nil {
		t.Fatal(err)
	}
	release, err := LockSQLiteStore(db)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{db, link} {
		_, err := LockSQLiteStore(name)
		if !errors.Is(err, ErrStoreLocked) {
			t.Fatalf("second LockSQLiteStore(%s) = %v, want ErrStoreLocked", name, err)
		}
		for _, want := range []string{fmt.Sprintf("pid %d", os.Getpid()), db, "one authority at a time uses an SQLite store", "PostgreSQL"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("second LockSQLiteStore(%s) = %q, want it to say %q", name, err, want)
			}
		}
	}
	release()
	again, err := LockSQLiteStore(link)
	if err != nil {
		t.Fatalf("LockSQLiteStore after release = %v", err)
	}
	again()
	if fi, err := os.Stat(SQLiteLockFile(db)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("lock file: %v %v, want 0600", fi, err)
	}
}
