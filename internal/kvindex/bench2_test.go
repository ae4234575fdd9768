package kvindex

import (
	"fmt"
	"testing"

	"kvrouter/internal/vllm"
)

// BenchmarkLookupStaircase looks up a 240,000-token prompt (15,000 blocks
// of 16) in an exact index where replica r of 96 holds the first (r+1)/96 of
// it: 727,500 (block, replica) pairs on the path. Keys are hashed once,
// outside the loop; routing's BenchmarkRoute adds hashing and the policy.
func BenchmarkLookupStaircase(b *testing.B) {
	const replicas, bs, blocks = 96, 16, 15_000
	x, err := NewExact(Config{Model: "m", BlockSize: bs}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	prompt := seq(1, blocks*bs)
	hs := make([]vllm.BlockHash, blocks)
	for i := range hs {
		hs[i] = vllm.BlockHash(i + 1)
	}
	pairs := 0
	for r := range replicas {
		n := (r + 1) * blocks / replicas
		pairs += n
		x.Apply(fmt.Sprintf("replica-%02d", r), &vllm.Batch{Events: []vllm.Event{{Type: vllm.BlockStored,
			BlockHashes: hs[:n], TokenIDs: prompt[:n*bs], BlockSize: bs}}})
	}
	keys := Keys(nil, prompt, bs, Extras{Root: x.Root()})
	out := make([]Match, 0, replicas)
	b.ReportAllocs()
	for b.Loop() {
		out = x.Lookup(keys, out)
	}
	if out[replicas-1].GPU != blocks || out[0].GPU != blocks/replicas {
		b.Fatalf("matches %+v ... %+v", out[0], out[replicas-1])
	}
	b.ReportMetric(float64(pairs), "pairs/lookup")
}

// BenchmarkChurn measures removal-heavy steady state: 16 engines each keep
// their last 64 stored chains of 32 blocks (32,768 entries, each chain held
// by 4 engines); one step is an engine storing a new chain (32 BlockStored
// blocks with re-hashing) and removing its oldest (32 BlockRemoved events of
// one block, as vLLM sends them). ops/s counts block operations.
func BenchmarkChurn(b *testing.B) {
	const engines, keep, chains, bs, perChain, share = 16, 64, 4096, 16, 32, 4
	ex := newExpander()
	stores := make([]*vllm.Batch, chains)
	removes := make([]*vllm.Batch, chains)
	for c := range chains {
		toks := make([]uint32, perChain*bs)
		copy(toks, ex.pool[(c*perChain*bs)%poolSize:])
		toks[0] = uint32(c)
		hs := make([]vllm.BlockHash, perChain)
		rm := make([]vllm.Event, perChain)
		for j := range hs {
			hs[j] = vllm.BlockHash(c*perChain + j + 1)
			rm[perChain-1-j] = vllm.Event{Type: vllm.BlockRemoved, BlockHashes: hs[j : j+1]}
		}
		stores[c] = &vllm.Batch{Events: []vllm.Event{{Type: vllm.BlockStored, BlockHashes: hs, TokenIDs: toks, BlockSize: bs}}}
		removes[c] = &vllm.Batch{Events: rm}
	}
	names := make([]string, engines)
	for e := range names {
		names[e] = fmt.Sprintf("engine-%02d", e)
	}
	x, err := NewExact(Config{Model: "m", BlockSize: bs, PredictTTL: -1}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	chainAt := func(step int) int { return step / share % chains }
	step := 0
	do := func() {
		e := step % engines
		x.Apply(names[e], stores[chainAt(step)])
		if old := step - engines*keep; old >= 0 {
			x.Apply(names[e], removes[chainAt(old)])
		}
		step++
	}
	for range engines * keep {
		do()
	}
	b.ReportAllocs()
	cpu := cpuTime()
	for b.Loop() {
		do()
	}
	cpu = cpuTime() - cpu
	s := x.Stats()
	if s.UnknownRemoved != 0 || s.Entries != engines*keep*perChain {
		b.Fatalf("churn inconsistent: %+v", s)
	}
	b.ReportMetric(float64(2*perChain)*float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	if cpu > 0 {
		b.ReportMetric(float64(2*perChain)*float64(b.N)/cpu.Seconds(), "ops/cpu-s")
	}
}

// BenchmarkPredictions measures the prediction bookkeeping of one routed
// request in steady state: 64 replicas all hold a 64-block system prompt;
// each op routes a new 512-block prompt (the system prompt, then 448 blocks
// of its own) to a replica (RoutedMatch after a Lookup that sees the
// predictions of the previous 64 requests), then that replica stores the
// prompt's blocks in 8 events of 56 (confirming them) and removes the
// blocks of the prompt it stored 64 ops ago. ns/op is per request;
// predicted-blocks/s counts the blocks predicted and confirmed.
func BenchmarkPredictions(b *testing.B) {
	const replicas, bs, sys, own, chunks, keep = 64, 16, 64, 448, 8, 64
	x, err := NewExact(Config{Model: "m", BlockSize: bs}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	names := make([]string, replicas)
	sysToks := seq(1<<30, sys*bs)
	sysHashes := make([]vllm.BlockHash, sys)
	for i := range sysHashes {
		sysHashes[i] = vllm.BlockHash(1<<40 + i)
	}
	for r := range names {
		names[r] = fmt.Sprintf("replica-%02d", r)
		x.Apply(names[r], &vllm.Batch{Events: []vllm.Event{{Type: vllm.BlockStored, BlockHashes: sysHashes,
			TokenIDs: sysToks, BlockSize: bs}}})
	}
	type prompt struct {
		toks   []uint32
		hashes []vllm.BlockHash
	}
	prompts := make([]prompt, keep)
	var keys []Key
	out := make([]Match, 0, replicas)
	n := 0
	do := func() {
		p := &prompts[n%keep]
		r := n % replicas
		if p.toks != nil {
			// The prompt stored keep requests ago leaves its replica.
			x.Apply(names[(n-keep)%replicas], &vllm.Batch{Events: []vllm.Event{{Type: vllm.BlockRemoved, BlockHashes: p.hashes}}})
		}
		p.toks = append(append(p.toks[:0], sysToks...), seq(n*own*bs, own*bs)...)
		p.hashes = p.hashes[:0]
		for i := range own {
			p.hashes = append(p.hashes, vllm.BlockHash(n*own+i+1))
		}
		keys = Keys(keys[:0], p.toks, bs, Extras{Root: x.Root()})
		out = x.Lookup(keys, out)
		x.RoutedMatch(ReplicaID(r), keys, out[r])
		parent := sysHashes[sys-1]
		for c := range chunks {
			lo, hi := c*own/chunks, (c+1)*own/chunks
			x.Apply(names[r], &vllm.Batch{Events: []vllm.Event{{Type: vllm.BlockStored, BlockHashes: p.hashes[lo:hi],
				ParentBlockHash: &parent, TokenIDs: p.toks[(sys+lo)*bs : (sys+hi)*bs], BlockSize: bs}}})
			parent = p.hashes[hi-1]
		}
		n++
	}
	for range keep {
		do()
	}
	s0 := x.Stats()
	b.ReportAllocs()
	for b.Loop() {
		do()
	}
	s := x.Stats()
	if d := s.Predicted - s0.Predicted; d != int64(own*b.N) || s.Confirmed-s0.Confirmed != d {
		b.Fatalf("predicted %d confirmed %d, want %d each", d, s.Confirmed-s0.Confirmed, own*b.N)
	}
	b.ReportMetric(float64(own*b.N)/b.Elapsed().Seconds(), "predicted-blocks/s")
}

// BenchmarkLookupPredicted looks up a 512-block prompt while many routed
// requests wait unconfirmed (an engine whose events stopped): 64 replicas
// hold a 64-block system prompt, and runs= requests of 512 blocks (the
// system prompt, then their own) are predicted across them. The prompt
// looked up shares the system prompt with every run, so each run is
// binary-searched.
func BenchmarkLookupPredicted(b *testing.B) {
	const replicas, bs, sys, blocks = 64, 16, 64, 512
	for _, runs := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprintf("runs=%d", runs), func(b *testing.B) {
			x, err := NewExact(Config{Model: "m", BlockSize: bs, MaxPredicted: 1 << 24}, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			sysToks := seq(1<<30, sys*bs)
			hs := make([]vllm.BlockHash, sys)
			for i := range hs {
				hs[i] = vllm.BlockHash(i + 1)
			}
			for r := range replicas {
				x.Apply(fmt.Sprintf("replica-%02d", r), &vllm.Batch{Events: []vllm.Event{{Type: vllm.BlockStored,
					BlockHashes: hs, TokenIDs: sysToks, BlockSize: bs}}})
			}
			var keys []Key
			for i := range runs {
				keys = Keys(keys[:0], append(append([]uint32(nil), sysToks...), seq(i*blocks*bs, (blocks-sys)*bs)...), bs, Extras{Root: x.Root()})
				x.Routed(ReplicaID(i%replicas), keys)
			}
			if s := x.Stats(); s.PredictedLive != int64(runs*(blocks-sys)) {
				b.Fatalf("live predictions %d", s.PredictedLive)
			}
			keys = Keys(keys[:0], append(append([]uint32(nil), sysToks...), seq(1<<29, (blocks-sys)*bs)...), bs, Extras{Root: x.Root()})
			out := make([]Match, 0, replicas)
			b.ReportAllocs()
			for b.Loop() {
				out = x.Lookup(keys, out)
			}
			if out[0].GPU != sys {
				b.Fatalf("match %+v", out[0])
			}
		})
	}
}
