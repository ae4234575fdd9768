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
