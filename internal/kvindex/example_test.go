package kvindex_test

import (
	"fmt"

	"kvrouter/internal/kvindex"
	"kvrouter/internal/vllm"
)

// An engine reports two stored blocks; a request sharing the first block
// finds it on that engine.
func Example() {
	ix, _ := kvindex.NewExact(kvindex.Config{Model: "qwen3", BlockSize: 4}, nil, nil)
	prompt := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	ix.Apply("engine-a", &vllm.Batch{Events: []vllm.Event{{
		Type: vllm.BlockStored, BlockHashes: []vllm.BlockHash{101, 102},
		TokenIDs: prompt, BlockSize: 4, Medium: "GPU",
	}}})

	req := []uint32{1, 2, 3, 4, 9, 9, 9, 9, 9} // same first block, partial tail
	keys := kvindex.Keys(nil, req, ix.BlockSize(), kvindex.Extras{Root: ix.Root()})
	out := ix.Lookup(keys, nil)
	id, _ := ix.ReplicaID("engine-a")
	fmt.Println(len(keys), "keys;", "engine-a leads with", out[id].Blocks(), "block(s) on GPU:", out[id].GPU)
	// Output: 2 keys; engine-a leads with 1 block(s) on GPU: 1
}
