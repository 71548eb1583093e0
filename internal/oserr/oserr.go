// Package oserr reduces the error of a failed file or socket operation to
// the system's reason ("file exists", "address already in use"). Go's
// errors say "op PATH: reason"; muster's messages name the path or address
// themselves, in words an operator reads, and would otherwise repeat it.
package oserr

import (
	"errors"
	"io/fs"
	"net"
	"os"
)

// Reason is the reason inside a *fs.PathError, *os.LinkError or
// *net.OpError (without the *os.SyscallError around it), and err itself
// for any other error. The reason is still an error errors.Is can match
// (syscall.EEXIST, fs.ErrExist, syscall.EADDRINUSE, ...).
func Reason(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		return le.Err
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		var se *os.SyscallError
		if errors.As(oe.Err, &se) {
			return se.Err
		}
		return oe.Err
	}
	return err
}
