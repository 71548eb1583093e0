package datadir

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/muster-dev/muster/internal/oserr"
	"github.com/muster-dev/muster/internal/shellword"
)

// renameNoReplace renames from to to, refusing a name that exists; a
// variable so that a test can make one move fail.
var renameNoReplace = func(from, to string) error {
	return unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE)
}

// moveInto moves the entries of staging (built inside target) into the
// existing, empty target and removes staging. authority.json, the mark of
// an initialised directory, moves last, so a directory without it was
// never initialised; RENAME_NOREPLACE makes every move refuse a name that
// appeared meanwhile (a racing init), and a failure moves back what was
// moved. What cannot be moved back is named in the error with the
// command that removes it: left there silently, it would make target look
// half initialised to the next init (which refuses a non-empty
// directory) and keep the new authority's keys where no one looks. target
// ends 0700 like a directory Init creates; where its owner cannot be
// changed (a volume given to a group), it must at least not be open to
// others. Its errors are whole sentences, not to be wrapped again.
func moveInto(staging, target string) error {
	if err := os.Chmod(target, 0o700); err != nil {
		fi, serr := os.Stat(target)
		if serr != nil || fi.Mode().Perm()&0o007 != 0 {
			return fmt.Errorf("datadir: %s is open to other users and cannot be made 0700 (%v): make it 0700 as its owner (chmod 0700 %s), or give an empty directory of this user's, then run muster init again",
				target, oserr.Reason(err), shellword.Quote(target))
		}
	}
	entries, err := os.ReadDir(staging)
	if err != nil {
		return fmt.Errorf("datadir: cannot read the new data directory %s built in %s: %w; nothing was moved: run muster init again", staging, target, oserr.Reason(err))
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
		err := renameNoReplace(filepath.Join(staging, name), filepath.Join(target, name))
		if err == nil {
			continue
		}
		err = fmt.Errorf("datadir: cannot move the new data directory's %s into %s: %w", name, target, oserr.Reason(err))
		var left []string
		for _, back := range names[:i] {
			if renameNoReplace(filepath.Join(target, back), filepath.Join(staging, back)) != nil {
				left = append(left, shellword.Quote(filepath.Join(target, back)))
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("%w; and what it moved there could not be moved back: %s was empty before, so remove what it holds now, the new authority's keys included (rm -rf -- %s), then run muster init again",
				err, target, strings.Join(left, " "))
		}
		return err
	}
	os.Remove(staging) // empty now; a leftover would only make DIR look non-empty to a later init
	return nil
}
