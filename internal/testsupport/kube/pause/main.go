// Command pause is the process of a pod sandbox in the real-node test
// (internal/testsupport/kube, Node): the first process of the pod's
// namespaces, which holds them while the pod's containers come and go.
// As Kubernetes' own pause does, it waits for SIGINT or SIGTERM and then
// exits 0, and as the pod's init process reaps the orphans reparented to
// it. It is built static (CGO_ENABLED=0) into a one-file image.
package main

import (
	"os"
	"os/signal"

	"golang.org/x/sys/unix"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, unix.SIGINT, unix.SIGTERM)
	child := make(chan os.Signal, 1)
	signal.Notify(child, unix.SIGCHLD)
	for {
		select {
		case <-stop:
			os.Exit(0)
		case <-child:
			for {
				var ws unix.WaitStatus
				pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
		}
	}
}
