//go:build unix

package sim

import (
	"syscall"
	"time"
)

// cpuTime returns the process's user plus system CPU time: benchmarks divide
// operations by it to report throughput per core on a shared machine, where
// wall time also counts the time other processes hold the cores.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
