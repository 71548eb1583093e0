//go:build !unix

package sqlite

// access is not checked where there is no access(2): the directory is
// taken as SQLite's os_win.c takes its temporary directory.
func access(string) bool { return true }
