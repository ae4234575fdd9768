//go:build !unix

package sim

import "time"

// cpuTime is unavailable here; cpu-s/run then reads 0.
func cpuTime() time.Duration { return 0 }
