package workload

import "testing"

// Run: go test -run '^$' -bench AppendTokens -benchtime 1s -count 1 ./internal/workload/

// BenchmarkAppendTokens expands the prompts of the first 2,000 requests of
// the Mooncake conversation trace (about 24M tokens) into one reused
// buffer, as the fleet simulator does at every arrival.
func BenchmarkAppendTokens(b *testing.B) {
	w, err := Mooncake(trace(b), MooncakeOptions{Limit: 2000})
	if err != nil {
		b.Fatal(err)
	}
	var buf []uint32
	var toks int
	b.ReportAllocs()
	for b.Loop() {
		for i := range w.Requests {
			buf = w.Requests[i].AppendTokens(buf[:0])
			toks += len(buf)
		}
	}
	b.ReportMetric(float64(toks)/b.Elapsed().Seconds(), "tokens/s")
}
