// Command pause is the pod sandbox ("infra") container of the real node started by hack/node.sh: it
// holds the pod's namespaces open and does nothing else until it is told to stop, like Kubernetes's own
// pause image (which no registry can give us here). Static (CGO_ENABLED=0), so the image is one file.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		// As PID 1 of a shared PID namespace, reap whatever exits, so no zombies pile up.
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
