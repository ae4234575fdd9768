package enginesim

import "unsafe"

// replayItem is one buffered batch: its sequence number and its encoded
// payload, which is never modified once buffered (the PUB socket and replay
// replies share it).
type replayItem struct {
	seq     uint64
	payload []byte
}

// replayItemSize is what one buffered batch costs besides its payload
// bytes: the ring slot holding its seq and payload slice header.
const replayItemSize = int64(unsafe.Sizeof(replayItem{}))

// replayBuffer is the publisher's replay buffer: the newest batches, at most
// maxItems of them (vLLM's buffer_steps) and at most maxBytes of payload
// plus replayItemSize per batch (engine-sim's own bound; vLLM's
// deque(maxlen=buffer_steps) has none). Both bounds hold after every push:
// the oldest batches are dropped one by one until they do, except that the
// newest batch is always kept, even one larger than maxBytes on its own:
// as in vLLM, a process that ever published holds its newest batch, which
// is how a subscriber tells a reconnection to the same process from a
// restart (docs/vllm-events.md). It is a ring that grows up to maxItems
// slots. Not safe for concurrent use (the publisher holds its mutex).
type replayBuffer struct {
	maxItems int
	maxBytes int64

	ring    []replayItem
	head, n int
	bytes   int64 // payload bytes plus replayItemSize per item held
}

// cost is what an item counts against maxBytes.
func (it *replayItem) cost() int64 { return int64(len(it.payload)) + replayItemSize }

// push appends a batch, then drops the oldest ones until both bounds hold
// (or only this one is left).
// payload must have its own backing array, sized to its length: the bound
// counts len, so spare capacity would be memory the bound does not see.
func (b *replayBuffer) push(seq uint64, payload []byte) {
	if b.n == len(b.ring) && b.n < b.maxItems {
		nr := make([]replayItem, min(max(16, 2*len(b.ring)), b.maxItems))
		for i := range b.n {
			nr[i] = b.ring[(b.head+i)%len(b.ring)]
		}
		b.ring, b.head = nr, 0
	}
	if b.n == len(b.ring) { // full at maxItems (or maxItems is 0)
		if b.n == 0 {
			return
		}
		b.popFront()
	}
	it := replayItem{seq: seq, payload: payload}
	b.ring[(b.head+b.n)%len(b.ring)] = it
	b.n++
	b.bytes += it.cost()
	for b.n > 1 && b.bytes > b.maxBytes {
		b.popFront()
	}
}

func (b *replayBuffer) popFront() {
	it := &b.ring[b.head]
	b.bytes -= it.cost()
	*it = replayItem{} // release the payload
	b.head = (b.head + 1) % len(b.ring)
	b.n--
}

// from appends to dst every held batch with seq >= start, oldest first.
func (b *replayBuffer) from(dst []replayItem, start uint64) []replayItem {
	for i := range b.n {
		if it := b.ring[(b.head+i)%len(b.ring)]; it.seq >= start {
			dst = append(dst, it)
		}
	}
	return dst
}

// reset empties the buffer (a new engine process), releasing the ring.
func (b *replayBuffer) reset() {
	b.ring, b.head, b.n, b.bytes = nil, 0, 0, 0
}
