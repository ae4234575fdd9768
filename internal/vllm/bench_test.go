package vllm

import (
	"fmt"
	"testing"
)

// Benchmarks for the engine contract's hot paths, in the units.
//
//	go test -run '^$' -bench . -benchtime 1s -count 1 ./internal/vllm/
//
// Results and the machine they ran on are in docs/vllm-hashes.md.

const benchBlocks = 32 // typicalBatch: one BlockStored of 32 blocks x 16 tokens

func BenchmarkDecodeBatch(b *testing.B) {
	for _, l := range []Layout{LayoutMap, LayoutArray} {
		batch := typicalBatch()
		payload, err := AppendBatch(nil, &batch, l)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("layout=%v/blocks=%d", l, benchBlocks), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(payload)))
			for b.Loop() {
				if _, err := DecodeBatch(payload); err != nil {
					b.Fatal(err)
				}
			}
			reportRates(b, benchBlocks)
		})
	}
}

func BenchmarkAppendBatch(b *testing.B) {
	for _, l := range []Layout{LayoutMap, LayoutArray} {
		batch := typicalBatch()
		buf := make([]byte, 0, 8192)
		b.Run(fmt.Sprintf("layout=%v/blocks=%d", l, benchBlocks), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var err error
				if buf, err = AppendBatch(buf[:0], &batch, l); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(int64(len(buf)))
			reportRates(b, benchBlocks)
		})
	}
}

// BenchmarkHashPrompt hashes a 32-block prompt (16-token blocks) per op.
func BenchmarkHashPrompt(b *testing.B) {
	tokens := typicalBatch().Events[0].TokenIDs
	for _, algo := range []HashAlgo{HashSHA256, HashSHA256CBOR, HashXXHash, HashXXHashCBOR} {
		for _, keys := range []struct {
			name string
			req  RequestKeys
		}{
			{"plain", RequestKeys{}},
			{"lora+salt", RequestKeys{LoRAName: "my-lora", CacheSalt: "tenant-42"}},
		} {
			h, err := NewBlockHasher(algo, "0", nil)
			if err != nil {
				b.Fatal(err)
			}
			b.Run(fmt.Sprintf("algo=%s/keys=%s/blocks=%d", algo, keys.name, benchBlocks), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					h.HashPrompt(tokens, 16, keys.req)
				}
				b.ReportMetric(float64(benchBlocks*b.N)/b.Elapsed().Seconds(), "blocks/s")
			})
		}
	}
}

// reportRates reports batches/s and blocks/s for n blocks per op.
func reportRates(b *testing.B, n int) {
	s := b.Elapsed().Seconds()
	b.ReportMetric(float64(b.N)/s, "batches/s")
	b.ReportMetric(float64(n*b.N)/s, "blocks/s")
}
