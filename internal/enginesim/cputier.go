package enginesim

import "kvrouter/internal/vllm"

// cpuEntry is one block held by the CPU tier.
type cpuEntry struct {
	hash       vllm.BlockHash
	meta       blockMeta
	prev, next int32
}

// cpuTier is an LRU of offloaded blocks keyed by hash: GPU blocks evicted
// from the prefix cache land here, and a request whose prefix continues in
// this tier reloads those blocks instead of recomputing them. It models an
// offloading connector whose store happens at GPU eviction. Most recently
// used entries are at the tail.
type cpuTier struct {
	entries    []cpuEntry
	byHash     *hashTable
	head, tail int32
	freeSlots  []int32
}

func newCPUTier(n int) *cpuTier {
	t := &cpuTier{
		entries:   make([]cpuEntry, n),
		byHash:    newHashTable(n),
		head:      nilBlock,
		tail:      nilBlock,
		freeSlots: make([]int32, n),
	}
	for i := range t.freeSlots {
		t.freeSlots[i] = int32(n - 1 - i)
	}
	return t
}

func (t *cpuTier) has(h vllm.BlockHash) bool {
	return t.byHash.get(h) >= 0
}

func (t *cpuTier) pushTail(i int32) {
	e := &t.entries[i]
	e.prev, e.next = t.tail, nilBlock
	if t.tail != nilBlock {
		t.entries[t.tail].next = i
	} else {
		t.head = i
	}
	t.tail = i
}

func (t *cpuTier) unlink(i int32) {
	e := &t.entries[i]
	if e.prev != nilBlock {
		t.entries[e.prev].next = e.next
	} else {
		t.head = e.next
	}
	if e.next != nilBlock {
		t.entries[e.next].prev = e.prev
	} else {
		t.tail = e.prev
	}
	e.prev, e.next = nilBlock, nilBlock
}

// touch marks h most recently used; it reports whether h is held.
func (t *cpuTier) touch(h vllm.BlockHash) bool {
	i := t.byHash.get(h)
	ok := i >= 0
	if ok {
		t.unlink(i)
		t.pushTail(i)
	}
	return ok
}

// put stores h, evicting the least recently used entry when full. It
// returns whether h was newly stored and the evicted hash, if any.
func (t *cpuTier) put(h vllm.BlockHash, m blockMeta) (stored bool, evicted vllm.BlockHash, didEvict bool) {
	if t.touch(h) {
		return false, 0, false
	}
	if len(t.freeSlots) == 0 {
		old := t.head
		evicted, didEvict = t.entries[old].hash, true
		t.unlink(old)
		t.byHash.del(evicted)
		t.entries[old].meta = blockMeta{}
		t.freeSlots = append(t.freeSlots, old)
	}
	i := t.freeSlots[len(t.freeSlots)-1]
	t.freeSlots = t.freeSlots[:len(t.freeSlots)-1]
	t.entries[i].hash, t.entries[i].meta = h, m
	t.byHash.set(h, i)
	t.pushTail(i)
	return true, evicted, didEvict
}

// reset empties the tier.
func (t *cpuTier) reset() {
	n := len(t.entries)
	t.byHash.reset()
	t.head, t.tail = nilBlock, nilBlock
	t.freeSlots = t.freeSlots[:0]
	for i := range t.entries {
		t.entries[i] = cpuEntry{prev: nilBlock, next: nilBlock}
		t.freeSlots = append(t.freeSlots, int32(n-1-i))
	}
}

func (t *cpuTier) len() int { return t.byHash.len() }
