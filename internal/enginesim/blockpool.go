package enginesim

import (
	"math/bits"

	"kvrouter/internal/vllm"
)

// nilBlock marks the end of an intrusive list and "no block".
const nilBlock int32 = -1

// gpuBlock is one physical KV block, as vLLM's KVCacheBlock.
type gpuBlock struct {
	ref    int32
	hashed bool
	// head marks the copy the hash index points to (the first of a dup
	// chain).
	head bool
	hash vllm.BlockHash
	// gen is bumped each time the block enters the free queue; a queue
	// entry is live while it carries the block's gen and ref is 0.
	gen uint32
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
// is also the LRU of cached blocks (evict from the head, free to the tail;
// a ring of (block, gen) entries where taking a block out of the middle
// just leaves a dead entry, so popping a run of blocks reads the ring in
// order instead of chasing list links from block to block),
// and the index from hash to the blocks holding it (the head copy; others
// chain through dup). Block 0 is the null block and never allocated, as in
// vLLM. Nothing is allocated after newBlockPool.
//
// The index is lazy: evicting a block whose hash has no other copy leaves
// its slot in place (eviction touches no index memory, which dominated the
// fleet simulator's profile as cache misses), and a slot counts only while
// its block still holds that hash as head. A slot is 8 bytes: the block id
// and a 32-bit tag of the hash (its low half), the full hash being checked
// on the block; so a hash may have stale slots besides its live one, all
// dropped by a rebuild from the blocks when the table is half full. The
// table has at least 4 slots per block (1 MiB for 27,000 blocks), so probes
// stay short and mostly within one cache line.
type blockPool struct {
	blocks    []gpuBlock
	fq        []freeEntry // ring; len a power of two >= 2 * len(blocks)
	fqHead    int         // index of the oldest entry
	fqLen     int         // entries, live or dead
	numFree   int
	index     []poolSlot // open addressing, linear probing
	mask      uint64
	shift     uint
	slotsUsed int // non-empty slots, live or stale
	maxUsed   int // rebuild above this
	// meta, one per block, is kept only when newBlockPool was asked to
	// (offload events need it); nil otherwise.
	meta []blockMeta
	// sink keeps warm's loads from being optimised away.
	sink int32
	// onEvict is called for every cached block that is evicted to be
	// reused, after it left the index; m is its meta (nil when not kept).
	onEvict func(id int32, b *gpuBlock, m *blockMeta)
}

// newBlockPool returns a pool of n blocks, all free; keepMeta keeps each
// cached block's blockMeta for onEvict.
func newBlockPool(n int, keepMeta bool) *blockPool {
	size := 16
	for size < 4*n {
		size *= 2
	}
	p := &blockPool{
		blocks:  make([]gpuBlock, n),
		fq:      make([]freeEntry, size/2),
		index:   make([]poolSlot, size),
		mask:    uint64(size - 1),
		shift:   uint(64 - bits.TrailingZeros(uint(size))),
		maxUsed: size / 2,
	}
	if keepMeta {
		p.meta = make([]blockMeta, n)
	}
	for i := range p.blocks {
		p.blocks[i] = gpuBlock{dup: nilBlock}
	}
	p.blocks[0].ref = 1 // the null block
	for i := 1; i < n; i++ {
		p.pushTail(int32(i))
	}
	return p
}

// usable is the number of blocks requests can hold.
func (p *blockPool) usable() int { return len(p.blocks) - 1 }

// freeEntry is one free-queue entry: live while blocks[id].gen == gen and
// the block is unreferenced.
type freeEntry struct {
	id  int32
	gen uint32
}

// pushTail appends unreferenced block id to the free queue. A full ring is
// first compacted to its live entries (at most len(blocks), so at least
// half of the ring is free again; a block's gen cannot wrap around while
// an old entry of it survives).
func (p *blockPool) pushTail(id int32) {
	mask := len(p.fq) - 1
	if p.fqLen == len(p.fq) {
		n := 0
		for k := 0; k < p.fqLen; k++ {
			e := p.fq[(p.fqHead+k)&mask]
			if p.liveEntry(e) {
				p.fq[(p.fqHead+n)&mask] = e
				n++
			}
		}
		p.fqLen = n
	}
	b := &p.blocks[id]
	b.gen++
	p.fq[(p.fqHead+p.fqLen)&mask] = freeEntry{id: id, gen: b.gen}
	p.fqLen++
	p.numFree++
}

func (p *blockPool) liveEntry(e freeEntry) bool {
	b := &p.blocks[e.id]
	return b.ref == 0 && b.gen == e.gen
}

// warmFree loads the blocks of the next n free-queue entries (independent
// loads the CPU overlaps) before a run of allocs pops them one by one. It
// changes nothing.
func (p *blockPool) warmFree(n int) {
	mask := len(p.fq) - 1
	var acc uint32
	for k := range min(n, p.fqLen) {
		acc += p.blocks[p.fq[(p.fqHead+k)&mask].id].gen
	}
	p.sink += int32(acc)
}

// popHead removes and returns the least recently freed block. The caller
// checked numFree.
func (p *blockPool) popHead() int32 {
	mask := len(p.fq) - 1
	for {
		e := p.fq[p.fqHead]
		p.fqHead = (p.fqHead + 1) & mask
		p.fqLen--
		if p.liveEntry(e) {
			p.numFree--
			return e.id
		}
	}
}

// home is h's first slot (Fibonacci hashing).
func (p *blockPool) home(h vllm.BlockHash) uint64 {
	return (uint64(h) * 0x9e3779b97f4a7c15) >> p.shift
}

// poolSlot is one slot of the pool's index: v is the block id plus one
// (zero: empty), tag the low 32 bits of the hash it was set for.
type poolSlot struct {
	tag uint32
	v   int32
}

func tagOf(h vllm.BlockHash) uint32 { return uint32(h) }

// slotOf returns the index of h's live slot (pointing at the head copy of
// h), or -1.
func (p *blockPool) slotOf(h vllm.BlockHash) int {
	tag := tagOf(h)
	for i := p.home(h); ; i = (i + 1) & p.mask {
		s := p.index[i]
		if s.v == 0 {
			return -1
		}
		if s.tag == tag && p.holdsHead(s.v-1, h) {
			return int(i)
		}
	}
}

// holdsHead reports whether block id is the head copy of h.
func (p *blockPool) holdsHead(id int32, h vllm.BlockHash) bool {
	b := &p.blocks[id]
	return b.hashed && b.head && b.hash == h
}

// lookup returns a block holding hash, or nilBlock.
func (p *blockPool) lookup(h vllm.BlockHash) int32 {
	if i := p.slotOf(h); i >= 0 {
		return p.index[i].v - 1
	}
	return nilBlock
}

// rebuild empties the index and re-inserts the head copy of every cached
// hash, dropping stale slots.
func (p *blockPool) rebuild() {
	clear(p.index)
	p.slotsUsed = 0
	for id := range p.blocks {
		b := &p.blocks[id]
		if !b.hashed || !b.head {
			continue
		}
		i := p.home(b.hash)
		for p.index[i].v != 0 {
			i = (i + 1) & p.mask
		}
		p.index[i] = poolSlot{tag: tagOf(b.hash), v: int32(id) + 1}
		p.slotsUsed++
	}
}

// touch takes a reference on a cached block, removing it from the free
// queue when it was unreferenced.
func (p *blockPool) touch(id int32) {
	b := &p.blocks[id]
	if b.ref == 0 {
		p.numFree-- // its queue entry dies with ref > 0
	}
	b.ref++
}

// alloc pops the least recently freed block, evicting its hash. The caller
// checked numFree.
func (p *blockPool) alloc() int32 {
	id := p.popHead()
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

// uncache removes block id from the index (keeping other copies). A head
// without copies just stops being live; a head with copies hands its slot
// to the next copy; a copy is unlinked from its chain.
func (p *blockPool) uncache(id int32) {
	b := &p.blocks[id]
	switch {
	case b.head && b.dup != nilBlock:
		p.index[p.slotOf(b.hash)].v = b.dup + 1
		p.blocks[b.dup].head = true
	case !b.head:
		for cur := p.lookup(b.hash); cur != nilBlock; cur = p.blocks[cur].dup {
			if p.blocks[cur].dup == id {
				p.blocks[cur].dup = b.dup
				break
			}
		}
	}
	b.hashed, b.head, b.dup = false, false, nilBlock
}

// warm loads the home slot of each of hs, independent loads the CPU
// overlaps, so that the cache calls that follow find them in the CPU cache.
// With many engines the index is far larger than the CPU cache and every
// insert of a new hash otherwise waits for one memory miss in turn (the
// fleet simulator's top cost). It changes nothing.
func (p *blockPool) warm(hs []vllm.BlockHash) {
	var acc int32
	for _, h := range hs {
		acc += p.index[p.home(h)].v
	}
	p.sink += acc
}

// cache registers block id under hash h; m is recorded when the pool keeps
// meta.
func (p *blockPool) cache(id int32, h vllm.BlockHash, m blockMeta) {
	if p.meta != nil {
		p.meta[id] = m
	}
	p.cacheHash(id, h)
}

// cacheHash registers block id under hash h, leaving its meta to the
// caller.
func (p *blockPool) cacheHash(id int32, h vllm.BlockHash) {
	b := &p.blocks[id]
	b.dup = nilBlock
	tag := tagOf(h)
	i := p.home(h)
	for ; ; i = (i + 1) & p.mask {
		s := p.index[i]
		if s.v == 0 {
			break
		}
		if s.tag == tag && p.holdsHead(s.v-1, h) { // another copy is head: chain behind it
			first := s.v - 1
			b.hashed, b.head, b.hash = true, false, h
			b.dup = p.blocks[first].dup
			p.blocks[first].dup = id
			return
		}
	}
	b.hashed, b.head, b.hash = true, true, h
	if p.slotsUsed >= p.maxUsed {
		p.rebuild() // places h too
		return
	}
	p.index[i] = poolSlot{tag: tag, v: id + 1}
	p.slotsUsed++
}

// free drops one reference per block, in the given order; blocks reaching
// zero go to the tail of the free queue. vLLM frees a request's blocks in
// reverse so that its tail blocks are evicted first; callers pass them so.
func (p *blockPool) free(ids []int32) {
	for _, id := range ids {
		p.release(id)
	}
}

// release drops one reference to block id, queueing it for eviction at the
// last one.
func (p *blockPool) release(id int32) {
	b := &p.blocks[id]
	b.ref--
	if b.ref == 0 {
		p.pushTail(id)
	}
}

// freeReversed frees ids from last to first. The blocks are loaded first
// (warm), so that their memory misses overlap instead of each waiting for
// the previous free.
func (p *blockPool) freeReversed(ids []int32) {
	if len(ids) > 1 {
		p.warmBlocks(ids)
	}
	for i := len(ids) - 1; i >= 0; i-- {
		p.release(ids[i])
	}
}

// warmBlocks loads the blocks ids name, independent loads the CPU overlaps.
// It changes nothing.
func (p *blockPool) warmBlocks(ids []int32) {
	var acc int32
	for _, id := range ids {
		acc += p.blocks[id].ref
	}
	p.sink += acc
}

// reset drops every hash; it reports false (and does nothing) when any
// block is referenced, as vLLM's reset_prefix_cache.
func (p *blockPool) reset() bool {
	if p.numFree != p.usable() {
		return false
	}
	clear(p.index)
	p.slotsUsed = 0
	for i := range p.blocks {
		b := &p.blocks[i]
		b.hashed, b.head, b.dup = false, false, nilBlock
	}
	clear(p.meta)
	return true
}

// usage is vLLM's BlockPool.get_usage: 1 - free/usable.
func (p *blockPool) usage() float64 {
	return 1 - float64(p.numFree)/float64(p.usable())
}
