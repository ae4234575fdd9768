package enginesim

import (
	"fmt"
	"testing"
)

// refPromptSeed is the output-token seed as documented: FNV-1a 64 over the
// prompt's token values, computed in one pass, independently of the
// block-by-block foldSeed.
func refPromptSeed(toks []uint32) uint64 {
	h := uint64(14695981039346656037)
	for _, t := range toks {
		h ^= uint64(t)
		h *= 1099511628211
	}
	return h
}

// TestOutputTokensFromPromptSeed checks that every generated token is
// splitmix64(FNV-1a(prompt) + index) mod vocab, whatever the prompt's
// length relative to the block size, with prefix-cache hits (the seed is
// folded as blocks are hashed, hit or not) and with preemption (hashes are
// kept across it, so no block may be folded twice).
func TestOutputTokensFromPromptSeed(t *testing.T) {
	for _, tc := range []struct {
		name   string
		blocks int // GPU blocks: small forces preemption
		lens   []int
	}{
		{"plain", 400, []int{1, 15, 16, 17, 31, 32, 33, 100, 513}},
		{"preempt", 40, []int{200, 201, 210, 150, 199}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewCore(CoreConfig{BlockSize: 16, NumGPUBlocks: tc.blocks, MaxModelLen: 16 * (tc.blocks - 1), MaxNumBatchedTokens: 64, VocabSize: 1000})
			if err != nil {
				t.Fatal(err)
			}
			prompts := map[string][]uint32{}
			for i, n := range tc.lens {
				p := make([]uint32, n)
				for j := range p {
					p[j] = uint32(7 + j*31 + (j/48)*i) // shared first 48 tokens
				}
				id := fmt.Sprint(i)
				prompts[id] = p
				if err := c.Submit(&Request{ID: id, Tokens: p, MaxTokens: 40}); err != nil {
					t.Fatal(err)
				}
			}
			got := 0
			for steps := 0; !c.Idle(); steps++ {
				if steps > 100000 {
					t.Fatal("core does not finish")
				}
				for _, o := range c.Step().Outputs {
					want := uint32(splitmix64(refPromptSeed(prompts[o.ID])+uint64(o.Index)) % 1000)
					if o.Token != want {
						t.Fatalf("request %s token %d = %d, want %d", o.ID, o.Index, o.Token, want)
					}
					got++
				}
			}
			if got != 40*len(tc.lens) {
				t.Fatalf("%d outputs, want %d", got, 40*len(tc.lens))
			}
			if tc.name == "preempt" && c.Stats().Preemptions == 0 {
				t.Fatal("no preemption: the case does not test it")
			}
		})
	}
}
