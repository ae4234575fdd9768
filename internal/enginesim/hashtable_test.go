package enginesim

import (
	"math/rand/v2"
	"slices"
	"testing"

	"kvrouter/internal/vllm"
)

// TestHashTableAgainstMap drives the open-addressing table and a Go map with
// the same random inserts, overwrites and deletes, at full capacity and
// with keys chosen to collide (few distinct homes, clustered runs that
// wrap around the end), and checks every key after every operation batch.
func TestHashTableAgainstMap(t *testing.T) {
	// 12 keys whose home is slot 15 of a 16-slot table (the table for 8
	// keys): every probe run wraps around the end.
	small := newHashTable(8)
	var sameHome []vllm.BlockHash
	for k := vllm.BlockHash(1); len(sameHome) < 12; k++ {
		if small.home(k) == 15 {
			sameHome = append(sameHome, k)
		}
	}
	cases := []struct {
		name    string
		maxKeys int
		key     func(r *rand.Rand) vllm.BlockHash
	}{
		{"random keys", 1000, func(r *rand.Rand) vllm.BlockHash { return vllm.BlockHash(r.Uint64()) }},
		{"small key space", 64, func(r *rand.Rand) vllm.BlockHash { return vllm.BlockHash(r.IntN(96)) }},
		{"dense ids", 500, func(r *rand.Rand) vllm.BlockHash { return vllm.BlockHash(r.IntN(700)) }},
		{"one home", 8, func(r *rand.Rand) vllm.BlockHash { return sameHome[r.IntN(len(sameHome))] }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			ht := newHashTable(c.maxKeys)
			ref := map[vllm.BlockHash]int32{}
			for op := range 20000 {
				k := c.key(r)
				if _, ok := ref[k]; ok && r.IntN(3) > 0 {
					ht.del(k)
					delete(ref, k)
				} else if ok || len(ref) < c.maxKeys {
					v := int32(r.IntN(1 << 20))
					ht.set(k, v)
					ref[k] = v
				}
				if ht.len() != len(ref) {
					t.Fatalf("op %d: len %d, want %d", op, ht.len(), len(ref))
				}
				if op%97 != 0 {
					continue
				}
				for k, v := range ref {
					if got := ht.get(k); got != v {
						t.Fatalf("op %d: get(%#x) = %d, want %d", op, uint64(k), got, v)
					}
				}
				// Every occupied slot is reachable from its home without
				// crossing an empty slot (no lost entries after shifts).
				for i, s := range ht.slots {
					if s.v == 0 {
						continue
					}
					for j := ht.home(s.key); j != uint64(i); j = (j + 1) & ht.mask {
						if ht.slots[j].v == 0 {
							t.Fatalf("op %d: key %#x at %d unreachable from home", op, uint64(s.key), i)
						}
					}
				}
			}
			for k := range ref {
				ht.del(k)
			}
			if ht.len() != 0 {
				t.Fatalf("len %d after deleting all", ht.len())
			}
			for i, s := range ht.slots {
				if s != (hashSlot{}) {
					t.Fatalf("slot %d not empty: %+v", i, s)
				}
			}
			if ht.get(c.key(r)) != -1 {
				t.Fatal("get on empty table found a key")
			}
		})
	}
}

// numHashed counts the blocks holding a hash.
func (p *blockPool) numHashed() int {
	n := 0
	for i := range p.blocks {
		if p.blocks[i].hashed {
			n++
		}
	}
	return n
}

// TestBlockPoolIndex drives a small pool through random allocations,
// caching (with duplicate copies of a hash), frees and evictions, many
// index rebuilds included, and checks after every operation that lookup
// finds a block holding the hash exactly when one exists, that every copy
// of a hash is on its head's chain, that each evicted block is reported
// once, and that blocks are reused in LRU order (a plain list as the
// model). Hashes share their low 32 bits (the index's tag) in groups of 16.
func TestBlockPoolIndex(t *testing.T) {
	const n = 64
	r := rand.New(rand.NewPCG(3, 4))
	p := newBlockPool(n, false)
	evicted := 0
	p.onEvict = func(id int32, b *gpuBlock, _ *blockMeta) {
		if b.hashed {
			t.Fatalf("block %d still hashed in onEvict", id)
		}
		evicted++
	}
	key := func(h int) vllm.BlockHash { return vllm.BlockHash(h%16) | vllm.BlockHash(h/16)<<40 }
	var held []int32
	lru := make([]int32, 0, n) // the free queue, oldest first
	for id := 1; id < n; id++ {
		lru = append(lru, int32(id))
	}
	freeModel := func(id int32) {
		if p.blocks[id].ref == 0 {
			lru = append(lru, id)
		}
	}
	rebuilds := 0
	for op := range 20000 {
		switch k := r.IntN(10); {
		case k < 5 && p.numFree > 0:
			id := p.alloc()
			if id != lru[0] {
				t.Fatalf("op %d: alloc = %d, least recently freed is %d", op, id, lru[0])
			}
			lru = lru[1:]
			held = append(held, id)
			if r.IntN(4) > 0 { // cache it under one of 3n hashes
				used := p.slotsUsed
				p.cache(id, key(r.IntN(3*n)), blockMeta{})
				if p.slotsUsed < used {
					rebuilds++
				}
			}
		case k < 9 && len(held) > 0:
			i := r.IntN(len(held))
			p.free(held[i : i+1])
			freeModel(held[i])
			held = append(held[:i], held[i+1:]...)
		case k == 9: // a reference on a cached block, free or held
			id := int32(1 + r.IntN(n-1))
			if p.blocks[id].hashed {
				if p.blocks[id].ref == 0 {
					lru = slices.DeleteFunc(lru, func(x int32) bool { return x == id })
				}
				p.touch(id)
				held = append(held, id)
			}
		}
		if p.numFree != len(lru) {
			t.Fatalf("op %d: numFree %d, model %d", op, p.numFree, len(lru))
		}
		for hi := 0; hi < 3*n; hi++ {
			h := key(hi)
			holders := map[int32]bool{}
			for id := range p.blocks {
				if b := &p.blocks[id]; b.hashed && b.hash == h {
					holders[int32(id)] = true
				}
			}
			got := p.lookup(h)
			if len(holders) == 0 {
				if got != nilBlock {
					t.Fatalf("op %d: lookup(%d) = %d, no block holds it", op, h, got)
				}
				continue
			}
			if !holders[got] {
				t.Fatalf("op %d: lookup(%d) = %d, holders %v", op, h, got, holders)
			}
			chain := 0
			for cur := got; cur != nilBlock; cur = p.blocks[cur].dup {
				if !holders[cur] {
					t.Fatalf("op %d: chain of %d has block %d", op, h, cur)
				}
				chain++
			}
			if chain != len(holders) {
				t.Fatalf("op %d: chain of %d has %d blocks, %d hold it", op, h, chain, len(holders))
			}
		}
	}
	if rebuilds == 0 || evicted == 0 {
		t.Fatalf("rebuilds %d, evictions %d: the test did not exercise them", rebuilds, evicted)
	}
	t.Logf("%d rebuilds, %d evictions", rebuilds, evicted)
}

// TestBlockPoolFreeQueueRing re-references and frees cached free blocks
// many times without allocating, so the free-queue ring fills with dead
// entries and is compacted again and again, and checks that allocation
// still follows LRU order.
func TestBlockPoolFreeQueueRing(t *testing.T) {
	const n = 8
	r := rand.New(rand.NewPCG(5, 6))
	p := newBlockPool(n, false)
	var lru []int32
	for range n - 1 {
		id := p.alloc()
		p.cache(id, vllm.BlockHash(id)<<32, blockMeta{})
		p.free([]int32{id})
		lru = append(lru, id)
	}
	for i := range 5000 {
		id := lru[r.IntN(len(lru))]
		p.touch(id)
		lru = slices.DeleteFunc(lru, func(x int32) bool { return x == id })
		p.free([]int32{id})
		lru = append(lru, id)
		if p.fqLen > len(p.fq) || p.numFree != n-1 {
			t.Fatalf("step %d: ring holds %d of %d, numFree %d", i, p.fqLen, len(p.fq), p.numFree)
		}
	}
	for _, want := range lru {
		if got := p.alloc(); got != want {
			t.Fatalf("alloc = %d, want %d (LRU order %v)", got, want, lru)
		}
	}
	if p.numFree != 0 {
		t.Fatalf("numFree %d after allocating every block", p.numFree)
	}
}
