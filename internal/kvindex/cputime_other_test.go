//go:build !unix

package kvindex

import "time"

// cpuTime is unavailable here; benchmarks then skip their ops/cpu-s metric.
func cpuTime() time.Duration { return 0 }
