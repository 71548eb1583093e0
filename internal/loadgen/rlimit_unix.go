//go:build unix

package loadgen

import "syscall"

// RaiseFileLimit raises this process's soft limit of open files to its
// hard limit (a stream run holds one connection per simulated agent) and
// returns the limit now in force. Go's runtime already raises it at start
// on Linux; this makes sure of it on every Unix and says what it is.
func RaiseFileLimit() (uint64, error) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, err
	}
	if l.Cur < l.Max {
		l.Cur = l.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
			return 0, err
		}
	}
	return l.Cur, nil
}
