//go:build !linux

package coturn

import "os/exec"

// setParentDeathSignal does nothing outside Linux, which has no
// parent-death signal: Stop is the only way the server ends.
func setParentDeathSignal(*exec.Cmd) {}
