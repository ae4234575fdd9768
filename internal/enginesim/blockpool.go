package enginesim

import "kvrouter/internal/vllm"

// nilBlock marks the end of an intrusive list and "no block".
const nilBlock int32 = -1

// gpuBlock is one physical KV block, as vLLM's KVCacheBlock.
type gpuBlock struct {
	ref    int32
	hashed bool
	hash   vllm.BlockHash
	// prev, next link the block into the free queue (ref == 0) only.
	prev, next int32
	// dup chains other blocks holding the same hash (vLLM keeps every
	// physical copy in cached_block_hash_to_block).
	dup int32
}

// blockMeta is what a BlockStored event for one block needs beyond its hash.
type blockMeta struct {
	parent    vllm.BlockHash
	hasParent bool
	tokens    []uint32
	extra     []any
	lora      *string
}

// blockPool is vLLM's BlockPool: a fixed array of blocks, a free queue that
// is also the LRU of cached blocks (evict from the head, free to the tail),
// and the map from hash to the blocks holding it (the first copy; others
// chain through dup). Block 0 is the null block and never allocated, as in
// vLLM. Nothing is allocated after newBlockPool.
type blockPool struct {
	blocks     []gpuBlock
	head, tail int32
	numFree    int
	cached     *hashTable
	// meta, one per block, is kept only when newBlockPool was asked to
	// (offload events need it); nil otherwise.
	meta []blockMeta
	// onEvict is called for every cached block that is evicted to be
	// reused, after it left the map; m is its meta (nil when not kept).
	onEvict func(id int32, b *gpuBlock, m *blockMeta)
}

// newBlockPool returns a pool of n blocks, all free; keepMeta keeps each
// cached block's blockMeta for onEvict.
func newBlockPool(n int, keepMeta bool) *blockPool {
	p := &blockPool{
		blocks: make([]gpuBlock, n),
		head:   nilBlock,
		tail:   nilBlock,
		cached: newHashTable(n),
	}
	if keepMeta {
		p.meta = make([]blockMeta, n)
	}
	for i := range p.blocks {
		p.blocks[i] = gpuBlock{prev: nilBlock, next: nilBlock, dup: nilBlock}
	}
	p.blocks[0].ref = 1 // the null block
	for i := 1; i < n; i++ {
		p.pushTail(int32(i))
	}
	return p
}

// usable is the number of blocks requests can hold.
func (p *blockPool) usable() int { return len(p.blocks) - 1 }

func (p *blockPool) pushTail(id int32) {
	b := &p.blocks[id]
	b.prev, b.next = p.tail, nilBlock
	if p.tail != nilBlock {
		p.blocks[p.tail].next = id
	} else {
		p.head = id
	}
	p.tail = id
	p.numFree++
}

func (p *blockPool) unlink(id int32) {
	b := &p.blocks[id]
	if b.prev != nilBlock {
		p.blocks[b.prev].next = b.next
	} else {
		p.head = b.next
	}
	if b.next != nilBlock {
		p.blocks[b.next].prev = b.prev
	} else {
		p.tail = b.prev
	}
	b.prev, b.next = nilBlock, nilBlock
	p.numFree--
}

// lookup returns a block holding hash, or nilBlock.
func (p *blockPool) lookup(h vllm.BlockHash) int32 {
	return p.cached.get(h) // -1 == nilBlock when absent
}

// touch takes a reference on a cached block, removing it from the free
// queue when it was unreferenced.
func (p *blockPool) touch(id int32) {
	b := &p.blocks[id]
	if b.ref == 0 {
		p.unlink(id)
	}
	b.ref++
}

// alloc pops the least recently freed block, evicting its hash. The caller
// checked numFree.
func (p *blockPool) alloc() int32 {
	id := p.head
	p.unlink(id)
	b := &p.blocks[id]
	if b.hashed {
		p.uncache(id)
		var m *blockMeta
		if p.meta != nil {
			m = &p.meta[id]
		}
		if p.onEvict != nil {
			p.onEvict(id, b, m)
		}
		if m != nil {
			*m = blockMeta{}
		}
	}
	b.ref = 1
	return id
}

// uncache removes block id from the hash map (keeping other copies).
func (p *blockPool) uncache(id int32) {
	b := &p.blocks[id]
	first := p.cached.get(b.hash)
	if first == id {
		if b.dup == nilBlock {
			p.cached.del(b.hash)
		} else {
			p.cached.set(b.hash, b.dup)
		}
	} else {
		for cur := first; cur != nilBlock; cur = p.blocks[cur].dup {
			if p.blocks[cur].dup == id {
				p.blocks[cur].dup = b.dup
				break
			}
		}
	}
	b.hashed, b.dup = false, nilBlock
}

// cache registers block id under hash h; m is recorded when the pool keeps
// meta.
func (p *blockPool) cache(id int32, h vllm.BlockHash, m blockMeta) {
	b := &p.blocks[id]
	b.hashed, b.hash = true, h
	if p.meta != nil {
		p.meta[id] = m
	}
	b.dup = nilBlock
	if first := p.cached.get(h); first != nilBlock {
		b.dup = p.blocks[first].dup
		p.blocks[first].dup = id
		return
	}
	p.cached.set(h, id)
}

// free drops one reference per block, in the given order; blocks reaching
// zero go to the tail of the free queue. vLLM frees a request's blocks in
// reverse so that its tail blocks are evicted first; callers pass them so.
func (p *blockPool) free(ids []int32) {
	for _, id := range ids {
		b := &p.blocks[id]
		b.ref--
		if b.ref == 0 {
			p.pushTail(id)
		}
	}
}

// freeReversed frees ids from last to first.
func (p *blockPool) freeReversed(ids []int32) {
	for i := len(ids) - 1; i >= 0; i-- {
		p.free(ids[i : i+1])
	}
}

// reset drops every hash; it reports false (and does nothing) when any
// block is referenced, as vLLM's reset_prefix_cache.
func (p *blockPool) reset() bool {
	if p.numFree != p.usable() {
		return false
	}
	p.cached.reset()
	for i := range p.blocks {
		b := &p.blocks[i]
		b.hashed, b.dup = false, nilBlock
	}
	clear(p.meta)
	return true
}

// usage is vLLM's BlockPool.get_usage: 1 - free/usable.
func (p *blockPool) usage() float64 {
	return 1 - float64(p.numFree)/float64(p.usable())
}
