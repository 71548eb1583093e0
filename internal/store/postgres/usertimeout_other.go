//go:build !linux

package postgres

import (
	"syscall"
	"time"
)

// setUserTimeout does nothing where TCP_USER_TIMEOUT is not offered: the
// keepalives and the store's request deadline remain.
func setUserTimeout(syscall.RawConn, time.Duration) error { return nil }
