//go:build unix

package gpu

import (
	"os/exec"
	"syscall"
)

// setProcessGroup puts the worker in its own process group, so a hang is
// ended by killing the group: the worker and anything it started
// (compute-sanitizer's target, a helper) together.
func setProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}

func killGroup(cmd *exec.Cmd) {
	if cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	_ = cmd.Process.Kill()
}

func signalOf(st interface{ Sys() any }) string {
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return ws.Signal().String()
	}
	return ""
}
