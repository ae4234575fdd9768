// Command pause is a Pod sandbox's process: it does nothing until SIGTERM
// or SIGINT, as the pause container of Kubernetes does. The real-cluster
// test packs it into the image containerd's sandbox_image names, since
// nothing can be pulled there (internal/k8stest).
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
	<-ch
}
