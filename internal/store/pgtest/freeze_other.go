//go:build !linux

package pgtest

import "errors"

// Freeze is only offered on Linux (freeze_linux.go), where the cluster's
// processes are found in /proc.
func (s *Server) Freeze() error { return errors.ErrUnsupported }

// Thaw: see Freeze.
func (s *Server) Thaw() error { return errors.ErrUnsupported }
