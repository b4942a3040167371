package coturn

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal has the kernel kill the server if this process dies
// first, so a crashed benchmark leaves no turnserver behind.
func setParentDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
