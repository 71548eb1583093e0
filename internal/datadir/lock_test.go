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

// A lock muster store reapply holds is named as its, with the way out
// (wait for it), not as another authority's with "stop it first, or give
// another --data", which is no way out of a restore; an authority's, and
// that of a muster which wrote only its pid, still reads as one.
func TestLockNamesTheHoldersCommand(t *testing.T) {
	pid := fmt.Sprintf("(pid %d)", os.Getpid())
	for _, tc := range []struct {
		name string
		take func(Dir, string) (func(), error)
		try  func(Dir, string) error
		is   error
	}{
		{"directory", func(d Dir, holder string) (func(), error) { return d.LockAs(holder) },
			func(d Dir, _ string) error { _, err := d.Lock(); return err }, ErrLocked},
		{"SQLite store", func(d Dir, holder string) (func(), error) { return LockSQLiteStoreAs(d.path("muster.db"), holder) },
			func(d Dir, _ string) error { _, err := LockSQLiteStore(d.path("muster.db")); return err }, ErrStoreLocked},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Dir(t.TempDir())
			release, err := tc.take(d, HolderReapply)
			if err != nil {
				t.Fatal(err)
			}
			err = tc.try(d, HolderAuthority)
			if !errors.Is(err, tc.is) || !HeldByCommand(err) {
				t.Fatalf("under reapply: %v, want %v held by a command", err, tc.is)
			}
			for _, want := range []string{"muster store reapply " + pid, "run this again once it has finished"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("under reapply: %q, want it to say %q", err, want)
				}
			}
			if strings.Contains(err.Error(), "another authority") || strings.Contains(err.Error(), "another --data") {
				t.Errorf("under reapply: %q names an authority", err)
			}
			release()
			release, err = tc.take(d, HolderAuthority)
			if err != nil {
				t.Fatal(err)
			}
			defer release()
			if err := tc.try(d, HolderReapply); !errors.Is(err, tc.is) || HeldByCommand(err) || !strings.Contains(err.Error(), "another authority "+pid) {
				t.Errorf("under an authority: %v, want another authority named", err)
			}
		})
	}
	// A lock file an older muster wrote holds the pid alone.
	if pid, holder := lockHolder(writeTemp(t, "4242\n")); pid != 4242 || holder != HolderAuthority {
		t.Errorf("an older lock file: pid %d, holder %q, want 4242 and the authority", pid, holder)
	}
}

func writeTemp(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "lock")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// An authority's lock file holds its pid alone, which scripts and the
// docs read with $(cat DIR/authority.lock).
func TestAuthorityLockFileHoldsThePidAlone(t *testing.T) {
	d := Dir(t.TempDir())
	release, err := d.Lock()
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if b, err := os.ReadFile(d.LockFile()); err != nil || string(b) != fmt.Sprintf("%d\n", os.Getpid()) {
		t.Errorf("authority.lock holds %q (%v), want the pid alone", b, err)
	}
}
