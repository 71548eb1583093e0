package datadir

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/muster-dev/muster/internal/oserr"
)

// moveInto moves the entries of staging (built inside target) into the
// existing, empty target and removes staging. authority.json, the mark of
// an initialised directory, moves last, so a directory without it was
// never initialised; RENAME_NOREPLACE makes every move refuse a name that
// appeared meanwhile (a racing init), and a failure moves back what was
// moved. target ends 0700 like a directory Init creates; where its owner
// cannot be changed (a volume given to a group), it must at least not be
// open to others.
func moveInto(staging, target string) error {
	if err := os.Chmod(target, 0o700); err != nil {
		fi, serr := os.Stat(target)
		if serr != nil || fi.Mode().Perm()&0o007 != 0 {
			return fmt.Errorf("datadir: %s is open to other users and cannot be made 0700: %w", target, oserr.Reason(err))
		}
	}
	entries, err := os.ReadDir(staging)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	info := filepath.Base(Dir(target).InfoFile())
	slices.SortFunc(names, func(a, b string) int {
		switch {
		case a == info:
			return 1
		case b == info:
			return -1
		}
		return 0
	})
	for i, name := range names {
		err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(staging, name), unix.AT_FDCWD, filepath.Join(target, name), unix.RENAME_NOREPLACE)
		if err != nil {
			for _, back := range names[:i] {
				os.Rename(filepath.Join(target, back), filepath.Join(staging, back))
			}
			return fmt.Errorf("datadir: cannot move the new data directory's %s into %s: %w", name, target, oserr.Reason(err))
		}
	}
	os.Remove(staging) // empty now; a leftover would only make DIR look non-empty to a later init
	return nil
}
