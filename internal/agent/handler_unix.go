//go:build unix

package agent

import (
	"os/exec"
	"syscall"
)

// inGroup starts cmd in a process group of its own and makes its
// cancellation kill the whole group, so children a handler started die
// with it and do not hold its output open.
func inGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
}

// killGroup kills what is left of cmd's process group once the handler
// has exited: a child it left running (`sleep 600 &`) would otherwise run
// on with no time limit. The group outlives its leader while any member
// does, so the ID still names it; with no member left Kill finds none.
func killGroup(cmd *exec.Cmd) {
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}
