package sim

import (
	"fmt"
	"testing"
)

// BenchmarkPooledBound computes the pooled-cache bound of the Mooncake
// conversation trace (12,031 requests) for a fleet of 8 and of 32 replicas,
// as every `kvrouter sim --scenario mooncake` run does; decode=step runs
// every decode token through Core.Step (the code before
// Core.DecodeAlone), decode=alone is PooledBound. Run:
//
//	go test -run '^$' -bench BenchmarkPooledBound -benchmem -benchtime 2x ./internal/sim/
func BenchmarkPooledBound(b *testing.B) {
	for _, replicas := range []int{8, 32} {
		sc, err := BuildScenario("mooncake", ScenarioOptions{Replicas: replicas, Trace: trace(b)})
		if err != nil {
			b.Fatal(err)
		}
		for _, step := range []bool{true, false} {
			mode := "alone"
			if step {
				mode = "step"
			}
			b.Run(fmt.Sprintf("replicas=%d/decode=%s", replicas, mode), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := pooledBound(b.Context(), Config{Replicas: replicas}, sc.Workload, step); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
