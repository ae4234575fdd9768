package routing

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"kvrouter/internal/kvindex"
	"kvrouter/internal/vllm"
)

// BenchmarkRoute scores a 240,000-token prompt (15,000 blocks) against 96
// replicas over the exact index, key hashing, lookup, policy and lease
// included. Fleets: "system" (every replica holds the first 256 blocks, one
// holds the whole prompt: 39,000 (block, replica) pairs on the prompt's
// path) and "staircase" (replica r holds the first (r+1)/96 of the prompt:
// 727,500 pairs, the worst case for a per-holder walk). Command and results:
// docs/routing.md.
//
//	go test -run '^$' -bench Route -benchtime 20x -count 1 ./internal/routing/
func BenchmarkRoute(b *testing.B) {
	const replicas, promptTokens = 96, 240_000
	for _, fleet := range []string{"system", "staircase"} {
		for _, policy := range []string{"kv", "dynamo", "llmd", "sglang"} {
			b.Run(fmt.Sprintf("fleet=%s/policy=%s/replicas=%d/tokens=240k", fleet, policy, replicas), func(b *testing.B) {
				benchRoute(b, fleet, policy, replicas, promptTokens)
			})
		}
	}
}

func benchRoute(b *testing.B, fleet, policy string, replicas, promptTokens int) {
	{
		{
			x, err := kvindex.NewExact(kvindex.Config{Model: "m", BlockSize: bs}, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			r, err := New(Config{Policy: policy, Rand: rand.New(rand.NewPCG(1, 1))}, x, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			prompt := tokens(1, promptTokens)
			blocks := promptTokens / bs
			hs := make([]vllm.BlockHash, blocks)
			for i := range hs {
				hs[i] = vllm.BlockHash(i + 1)
			}
			for i := range replicas {
				name := fmt.Sprintf("replica-%02d", i)
				r.AddReplica(name)
				n := (i + 1) * blocks / replicas
				if fleet == "system" {
					n = 256
					if i == replicas/2 {
						n = blocks
					}
				}
				x.Apply(name, &vllm.Batch{Events: []vllm.Event{{Type: vllm.BlockStored, BlockHashes: hs[:n],
					TokenIDs: prompt[:n*bs], BlockSize: bs}}})
			}
			req := &Request{Tokens: prompt, MaxTokens: 100}
			b.ReportAllocs()
			for b.Loop() {
				d, l, err := r.Route(req)
				if err != nil || d.Chosen().CachedBlocks == 0 {
					b.Fatal(err, d.Name)
				}
				l.Release()
			}
		}
	}
}
