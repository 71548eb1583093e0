//go:build unix

package sqlite

import "golang.org/x/sys/unix"

func access(dir string) bool { return unix.Access(dir, unix.W_OK|unix.X_OK) == nil }
