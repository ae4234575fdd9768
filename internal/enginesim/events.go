package enginesim

import "kvrouter/internal/vllm"

// blockMeta records what an offload event for block i of s needs.
func (c *Core) blockMeta(s *seq, i int) blockMeta {
	bs := c.cfg.BlockSize
	m := blockMeta{
		tokens: s.tokens[i*bs : (i+1)*bs : (i+1)*bs],
		extra:  c.extraKeys(s, i),
		lora:   s.lora,
	}
	if i > 0 {
		m.parent, m.hasParent = s.hashes[i-1], true
	}
	return m
}

// storedEvent builds the BlockStored for blocks [from, to) of s as vLLM's
// BlockPool.cache_full_blocks does: the parent is the hash of block from-1
// (nil from block 0, and always nil for a hit report, withParent false),
// token_ids are all tokens of those blocks, extra_keys has one entry per
// block (nil for plain text).
func (c *Core) storedEvent(s *seq, from, to int, medium vllm.Medium, withParent bool) vllm.Event {
	bs := c.cfg.BlockSize
	e := vllm.Event{
		Type:            vllm.BlockStored,
		BlockHashes:     s.hashes[from:to:to],
		TokenIDs:        s.tokens[from*bs : to*bs : to*bs],
		BlockSize:       bs,
		Medium:          medium.String(),
		LoRAName:        s.lora,
		GroupIdx:        c.group0,
		KVCacheSpecKind: vllm.FullAttention,
	}
	if withParent && from > 0 {
		p := s.hashes[from-1]
		e.ParentBlockHash = &p
	}
	if s.lora != nil {
		id := c.loraIDs[*s.lora]
		e.LoRAID = &id
	}
	if s.lora == nil && s.salt == "" && len(s.mm) == 0 {
		e.ExtraKeys = c.nilKeys(to - from)
		return e
	}
	e.ExtraKeys = make([][]any, to-from)
	for i := from; i < to; i++ {
		e.ExtraKeys[i-from] = c.extraKeys(s, i)
	}
	return e
}

// nilKeys returns n nil extra keys (a plain prompt's) from the shared
// read-only slab, capped at n.
func (c *Core) nilKeys(n int) [][]any {
	if n > len(c.noKeys) {
		c.noKeys = make([][]any, max(n, 1024))
	}
	return c.noKeys[:n:n]
}

// removedHashes returns a one-element slice holding h, carved from the
// slab so that a run of evictions does not allocate per block.
func (c *Core) removedHashes(h vllm.BlockHash) []vllm.BlockHash {
	if len(c.removedSlab) == 0 {
		c.removedSlab = make([]vllm.BlockHash, 512)
	}
	c.removedSlab[0] = h
	hs := c.removedSlab[:1:1]
	c.removedSlab = c.removedSlab[1:]
	return hs
}

// metaEvent builds a one-block BlockStored from a block's recorded meta.
func (c *Core) metaEvent(h vllm.BlockHash, m *blockMeta, medium vllm.Medium) vllm.Event {
	e := vllm.Event{
		Type:            vllm.BlockStored,
		BlockHashes:     []vllm.BlockHash{h},
		TokenIDs:        m.tokens,
		BlockSize:       c.cfg.BlockSize,
		Medium:          medium.String(),
		LoRAName:        m.lora,
		ExtraKeys:       [][]any{m.extra},
		GroupIdx:        c.group0,
		KVCacheSpecKind: vllm.FullAttention,
	}
	if m.hasParent {
		p := m.parent
		e.ParentBlockHash = &p
	}
	if m.lora != nil {
		id := c.loraIDs[*m.lora]
		e.LoRAID = &id
	}
	return e
}

func (c *Core) removedEvent(h vllm.BlockHash, medium vllm.Medium) vllm.Event {
	return vllm.Event{
		Type:        vllm.BlockRemoved,
		BlockHashes: c.removedHashes(h),
		Medium:      medium.String(),
		GroupIdx:    c.group0,
	}
}

// evicted handles a cached GPU block evicted for reuse: a BlockRemoved
// (vLLM _maybe_evict_cached_block, one per physical copy), then, with a CPU
// tier, the offload: the block is stored on CPU (BlockStored, medium CPU),
// evicting the tier's least recently used block (BlockRemoved, medium CPU).
// m is the block's meta, kept by the pool exactly when there is a CPU tier
// and events are on.
func (c *Core) evicted(_ int32, b *gpuBlock, m *blockMeta) {
	ev := !c.cfg.NoEvents
	if ev {
		c.pending = append(c.pending, c.removedEvent(b.hash, vllm.MediumGPU))
	}
	if c.cpu == nil {
		return
	}
	var meta blockMeta
	if m != nil {
		meta = *m
	}
	stored, old, didEvict := c.cpu.put(b.hash, meta)
	if !ev {
		return
	}
	if didEvict {
		c.pending = append(c.pending, c.removedEvent(old, vllm.MediumCPU))
	}
	if stored {
		c.pending = append(c.pending, c.metaEvent(b.hash, &meta, vllm.MediumCPU))
	}
}
