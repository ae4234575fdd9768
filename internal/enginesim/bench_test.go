package enginesim

import (
	"fmt"
	"testing"

	"kvrouter/internal/vllm"
)

// Run: go test -run '^$' -bench Core -benchtime 1s -count 1 ./internal/enginesim/
// Results and the fleet-simulator budget they imply: docs/engine-sim.md.

// benchWorkload is n requests of promptLen tokens in groups sharing the
// first half of their prompt, each generating outLen tokens.
func benchWorkload(n, promptLen, outLen int) []*Request {
	reqs := make([]*Request, n)
	for i := range reqs {
		p := make([]uint32, promptLen)
		for j := range p {
			if j < promptLen/2 {
				p[j] = uint32(1 + (i%8)*promptLen + j) // 8 shared system prompts
			} else {
				p[j] = uint32(1_000_000 + i*promptLen + j)
			}
		}
		reqs[i] = &Request{ID: fmt.Sprint(i), Tokens: p, MaxTokens: outLen}
	}
	return reqs
}

// BenchmarkCoreRequests simulates whole requests: 256 requests of 4,096
// prompt tokens (half shared) and 128 output tokens per iteration, through
// admission, chunked prefill, decode and completion on a fresh core.
func BenchmarkCoreRequests(b *testing.B) {
	for _, mode := range []struct {
		name   string
		events bool
	}{{"events=off", false}, {"events=on", true}} {
		b.Run(mode.name, func(b *testing.B) {
			reqs := benchWorkload(256, 4096, 128)
			var steps, done int
			b.ReportAllocs()
			for b.Loop() {
				c, err := NewCore(CoreConfig{Profile: ProfileH100, NoEvents: !mode.events})
				if err != nil {
					b.Fatal(err)
				}
				for _, r := range reqs {
					if err := c.Submit(r); err != nil {
						b.Fatal(err)
					}
				}
				for !c.Idle() {
					c.Step()
					steps++
				}
				done += len(reqs)
			}
			b.ReportMetric(float64(done)/b.Elapsed().Seconds(), "requests/s")
			b.ReportMetric(float64(steps)/b.Elapsed().Seconds(), "steps/s")
		})
	}
}

// BenchmarkCoreDecodeStep is one steady-state decode step of 64 running
// sequences (the common step in a fleet simulation). The core is rebuilt,
// off the clock, every 2,000 steps so that sequences never finish.
func BenchmarkCoreDecodeStep(b *testing.B) {
	fresh := func() *Core {
		c, err := NewCore(CoreConfig{Profile: ProfileH100, NoEvents: true})
		if err != nil {
			b.Fatal(err)
		}
		for _, r := range benchWorkload(64, 1024, 4096) {
			if err := c.Submit(r); err != nil {
				b.Fatal(err)
			}
		}
		for range 20 {
			c.Step()
		}
		return c
	}
	c := fresh()
	steps := 0
	b.ReportAllocs()
	for b.Loop() {
		if steps++; steps%2000 == 0 {
			b.StopTimer()
			c = fresh()
			b.StartTimer()
		}
		if res := c.Step(); res.DecodeSeqs != 64 {
			b.Fatalf("decode seqs %d", res.DecodeSeqs)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "steps/s")
}

// BenchmarkHasher is one 16-token block hashed in a chain, per algorithm:
// the cost the fast mode saves in a fleet simulation.
func BenchmarkHasher(b *testing.B) {
	toks := make([]uint32, 16)
	for i := range toks {
		toks[i] = uint32(1000 + i*7919)
	}
	hashers := []struct {
		name string
		h    BlockHasher
	}{{"algo=fast", NewFastHasher("0")}}
	for _, a := range []vllm.HashAlgo{vllm.HashSHA256, vllm.HashSHA256CBOR, vllm.HashXXHash, vllm.HashXXHashCBOR} {
		h, err := vllm.NewBlockHasher(a, "0", nil)
		if err != nil {
			b.Fatal(err)
		}
		hashers = append(hashers, struct {
			name string
			h    BlockHasher
		}{"algo=" + string(a), h})
	}
	for _, hc := range hashers {
		b.Run(hc.name, func(b *testing.B) {
			parent := hc.h.HashBlock(nil, toks, nil)
			parent = append([]byte(nil), parent...)
			b.ReportAllocs()
			for b.Loop() {
				d := hc.h.HashBlock(parent, toks, nil)
				parent = append(parent[:0], d...)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}
