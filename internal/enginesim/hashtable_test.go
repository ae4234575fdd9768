package enginesim

import (
	"math/rand/v2"
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
// of a hash is on its head's chain, and that each evicted block is
// reported once.
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
	var held []int32
	rebuilds := 0
	for op := range 20000 {
		switch k := r.IntN(10); {
		case k < 5 && p.numFree > 0:
			id := p.alloc()
			held = append(held, id)
			if r.IntN(4) > 0 { // cache it under one of 3n hashes
				used := p.slotsUsed
				p.cache(id, vllm.BlockHash(r.IntN(3*n)), blockMeta{})
				if p.slotsUsed < used {
					rebuilds++
				}
			}
		case k < 9 && len(held) > 0:
			i := r.IntN(len(held))
			p.free(held[i : i+1])
			held = append(held[:i], held[i+1:]...)
		case k == 9 && len(held) > 0: // another reference on a held block
			id := held[r.IntN(len(held))]
			if p.blocks[id].hashed {
				p.touch(id)
				held = append(held, id)
			}
		}
		for h := vllm.BlockHash(0); h < 3*n; h++ {
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
