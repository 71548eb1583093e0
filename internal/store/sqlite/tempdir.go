package sqlite

import (
	"fmt"
	"os"
	"strings"
)

// tempDirCandidates are where SQLite (os_unix.c, unixTempFileDir) looks for
// a directory to keep its temporary files in, in its order, after
// SQLITE_TMPDIR and TMPDIR: the last is the working directory.
var tempDirCandidates = []string{"/var/tmp", "/usr/tmp", "/tmp", "."}

// TempDir returns the directory SQLite keeps its temporary files in: those
// of a sort or an index build larger than its page cache (a migration on a
// large table, a large ORDER BY). It picks the first of SQLITE_TMPDIR,
// TMPDIR, /var/tmp, /usr/tmp, /tmp and the working directory that is a
// directory it may write in and search, as SQLite does. With none, it
// returns an error naming the fix: SQLite opens the store, and fails such
// a statement with "disk I/O error" only when it first needs the space,
// as under a read-only root filesystem with no writable /tmp.
func TempDir() (string, error) {
	return tempDir(os.Getenv, tempDirCandidates, writableDir)
}

func tempDir(getenv func(string) string, candidates []string, writable func(string) bool) (string, error) {
	dirs := append([]string{getenv("SQLITE_TMPDIR"), getenv("TMPDIR")}, candidates...)
	var looked []string
	for _, d := range dirs {
		if d == "" {
			continue
		}
		if writable(d) {
			return d, nil
		}
		looked = append(looked, d)
	}
	return "", fmt.Errorf("SQLite has no writable directory for its temporary files (looked at %s): sorts and index builds larger than its cache, an upgrade's migration on a large table among them, will fail with \"disk I/O error\"; make /tmp writable (a tmpfs, or in Kubernetes an emptyDir mounted at /tmp, as the Helm chart does) or set SQLITE_TMPDIR to a writable directory, such as the data directory",
		strings.Join(looked, ", "))
}

// writableDir reports whether dir is a directory this process may create
// files in, as SQLite checks it (stat, then access W_OK|X_OK).
func writableDir(dir string) bool {
	fi, err := os.Stat(dir)
	return err == nil && fi.IsDir() && access(dir)
}
