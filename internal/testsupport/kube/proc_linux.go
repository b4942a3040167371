//go:build linux

package kube

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel kill the component if the test process
// dies without stopping it.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
