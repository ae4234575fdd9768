package kvindex

import (
	"math/rand/v2"
	"testing"
	"time"
)

// BenchmarkApproxRouted measures the approximate index's part of routing
// one 100K-token request (6,400 blocks) to a replica at its default
// capacity (65,536 blocks), full: prompt=new inserts every block and
// evicts as many; prompt=continue is the previous prompt continued by
// two blocks (a Lookup, then Routed moving the held blocks to the front
// and inserting the new ones). CPU time per request beside wall time.
//
//	go test -run '^$' -bench ApproxRouted -benchtime 200x ./internal/kvindex/
func BenchmarkApproxRouted(b *testing.B) {
	const blocks = 6_400
	for _, cont := range []bool{false, true} {
		name := map[bool]string{false: "prompt=new", true: "prompt=continue"}[cont]
		b.Run(name, func(b *testing.B) {
			a, err := NewApprox(Config{Model: "m"}, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			id := a.AddReplica("r")
			rng := rand.New(rand.NewPCG(1, 2))
			prompt := func(n int) []Key {
				ks := make([]Key, n)
				for i := range ks {
					ks[i] = Key(rng.Uint64())
				}
				return ks
			}
			for range 2 * DefaultApproxCapacity / blocks { // fill to capacity
				a.Routed(id, prompt(blocks))
			}
			var out []Match
			var cpu time.Duration
			b.ResetTimer()
			for range b.N {
				keys := prompt(blocks)
				if cont {
					b.StopTimer()
					a.Routed(id, keys)
					keys = append(keys, prompt(2)...)
					b.StartTimer()
				}
				c0 := cpuTime()
				out = a.Lookup(keys, out)
				a.Routed(id, keys)
				cpu += cpuTime() - c0
			}
			b.ReportMetric(cpu.Seconds()/float64(b.N)*1e6, "cpu-µs/op")
		})
	}
}
