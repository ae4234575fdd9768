package enginesim

import (
	"fmt"

	"kvrouter/internal/vllm"
)

// mmExtraKeys returns the extra keys of block i of s when s has
// multimodal items, in vLLM's order (vllm.BlockExtraKeys: LoRA name, one
// (identifier, offset - block start) tuple per item overlapping the block,
// cache_salt on block 0), items given by mm.
func mmExtraKeys(s *seq, block, bs int, mm []vllm.MMFeature) []any {
	return vllm.BlockExtraKeys(vllm.RequestKeys{LoRAName: derefString(s.lora), CacheSalt: s.salt, MM: mm}, block*bs, (block+1)*bs)
}

// hashKeys returns the extra keys block i of s is hashed with. They are its
// extraKeys except for a block that ends past the prompt (completed during
// decode): vLLM's request block hasher then looks at the last multimodal
// item only (start_mm_idx -1 in _gen_mm_extra_hash_keys, see
// testdata/vllm/README.md), while the BlockStored event's extra_keys list
// every overlapping item. The two differ only when such a block holds the
// tails of two or more items.
func (c *Core) hashKeys(s *seq, block int) []any {
	bs := c.cfg.BlockSize
	if len(s.mm) > 1 && (block+1)*bs > s.promptLen {
		return mmExtraKeys(s, block, bs, s.mm[len(s.mm)-1:])
	}
	return c.extraKeys(s, block)
}

// checkMM validates a request's multimodal items against its prompt of n
// tokens (ErrInvalidRequest).
func checkMM(mm []vllm.MMFeature, n int) error {
	end := 0
	for i, f := range mm {
		switch {
		case f.Identifier == "":
			return fmt.Errorf("%w: multimodal item %d has no identifier", ErrInvalidRequest, i)
		case f.Length < 1 || f.Offset < end || f.Offset > n-f.Length:
			return fmt.Errorf("%w: multimodal item %d at %d+%d: want sorted, disjoint ranges inside the %d-token prompt", ErrInvalidRequest, i, f.Offset, f.Length, n)
		}
		end = f.Offset + f.Length
	}
	return nil
}
