package sim

import (
	"testing"

	"kvrouter/internal/workload"
)

// BenchmarkRun simulates the Mooncake conversation trace with the default
// policies (round_robin, least_load, kv, cache_greedy), in parallel on
// GOMAXPROCS. The issue's goal is replicas=64/requests=24062 (the trace
// twice) in at most 10 s; cpu-s/run is the process CPU time per run. Run:
//
//	go test -run '^$' -bench BenchmarkRun -benchtime 1x ./internal/sim/
func BenchmarkRun(b *testing.B) {
	cases := []struct {
		name     string
		replicas int
		limit    int
		copies   int
	}{
		{"replicas=8/requests=2000", 8, 2000, 1},
		{"replicas=64/requests=24062", 64, 0, 2},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			sc, err := BuildScenario("mooncake", ScenarioOptions{Replicas: c.replicas, Requests: c.limit, Trace: trace(b)})
			if err != nil {
				b.Fatal(err)
			}
			w, err := workload.Repeat(sc.Workload, c.copies)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			cpu := cpuTime()
			for b.Loop() {
				if _, err := Run(b.Context(), Config{Replicas: c.replicas}, w); err != nil {
					b.Fatal(err)
				}
			}
			cpu = cpuTime() - cpu
			b.ReportMetric(float64(len(w.Requests)*b.N)/b.Elapsed().Seconds(), "requests/s")
			b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/run")
			b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu-s/run")
		})
	}
}

// BenchmarkPolicy runs the issue's workload (the Mooncake trace twice,
// 24,062 requests, 64 replicas) with one policy at a time, as
// `kvrouter sim --scenario mooncake --replicas 64 --repeat 2 --policies P`
// does (pipelined when a core is free). The goal is at most 10 s a run;
// cpu-s/run is the process's CPU time (user+system, both goroutines) per
// run, which a busy machine moves far less than s/run:
//
//	go test -run '^$' -bench 'BenchmarkPolicy/policy=kv' -benchtime 1x ./internal/sim/
func BenchmarkPolicy(b *testing.B) {
	w := issueWorkload(b)
	for _, p := range DefaultPolicies() {
		b.Run("policy="+p, func(b *testing.B) {
			b.ReportAllocs()
			cpu := cpuTime()
			for b.Loop() {
				if _, err := Run(b.Context(), Config{Replicas: 64, Policies: []string{p}}, w); err != nil {
					b.Fatal(err)
				}
			}
			cpu = cpuTime() - cpu
			b.ReportMetric(float64(len(w.Requests)*b.N)/b.Elapsed().Seconds(), "requests/s")
			b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/run")
			b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu-s/run")
		})
	}
}

// issueWorkload is issue 7's simulator workload: the Mooncake conversation
// trace twice (24,062 requests) at the load the mooncake scenario gives 64
// replicas.
func issueWorkload(b *testing.B) *workload.Workload {
	sc, err := BuildScenario("mooncake", ScenarioOptions{Replicas: 64, Trace: trace(b)})
	if err != nil {
		b.Fatal(err)
	}
	w, err := workload.Repeat(sc.Workload, 2)
	if err != nil {
		b.Fatal(err)
	}
	return w
}
