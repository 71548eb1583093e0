//go:build !unix

package agent

import "os/exec"

// inGroup: without process groups, cancellation kills the handler alone;
// WaitDelay still bounds the wait for output a child holds.
func inGroup(*exec.Cmd) {}

// killGroup: without process groups there is no group to kill.
func killGroup(*exec.Cmd) {}
