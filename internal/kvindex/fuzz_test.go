package kvindex

import (
	"testing"

	"kvrouter/internal/vllm"
)

// FuzzExactApply feeds arbitrary event sequences (engine input) to an Exact
// index: it must never panic, and its counts must stay consistent with what a
// full lookup sees.
func FuzzExactApply(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 0, 5, 17, 250})
	f.Add([]byte{4, 4, 0, 9, 9, 9, 1, 9, 3, 0, 0, 0, 0, 7})
	f.Fuzz(func(t *testing.T, data []byte) {
		c := newClock()
		x := testExact(c, func(cfg *Config) { cfg.MaxEntries = 64 })
		toks := seq(0, 64)
		engines := []string{"a", "b"}
		for i := 0; i+3 < len(data) && i < 400; i += 4 {
			op, a, b, m := data[i]%6, int(data[i+1]), int(data[i+2]), data[i+3]
			eng := engines[m&1]
			rank := int(m>>1) & 1
			medium := []string{"", "GPU", "CPU", "STORAGE", "DISK?"}[int(m>>2)%5]
			switch op {
			case 0, 1: // store n blocks after an optional parent
				n := 1 + a%4
				start := b % 12
				var parent *vllm.BlockHash
				if op == 1 {
					parent = hp(uint64(b % 16))
				}
				hs := make([]uint64, n)
				for j := range hs {
					hs[j] = uint64(start + j)
				}
				end := min((start+n)*4, len(toks))
				tk := toks[min(start*4, end):end]
				if a&64 != 0 {
					tk = nil // tokenless or short: must be skipped or placed
				}
				x.Apply(eng, batch(rank, storedEv(parent, hs, tk, medium)))
			case 2:
				x.Apply(eng, batch(rank, removedEv(medium, uint64(a%16), uint64(b%16))))
			case 3:
				x.Apply(eng, batch(rank, vllm.Event{Type: vllm.AllBlocksCleared}))
			case 4:
				x.Reset(eng, rank)
			case 5:
				id := x.AddReplica(eng)
				x.Routed(id, Keys(nil, toks[:a%64], 4, Extras{Root: x.Root()}))
			}
			s := x.Stats()
			if s.Entries > 64 || s.Entries < 0 {
				t.Fatalf("entries %d beyond cap", s.Entries)
			}
			total := 0
			for _, e := range engines {
				if id, ok := x.ReplicaID(e); ok {
					total += x.ReplicaBlocks(id)
				}
			}
			if int64(total) != s.Entries {
				t.Fatalf("per-replica entries %d != %d", total, s.Entries)
			}
			keys := Keys(nil, toks, 4, Extras{Root: x.Root()})
			for _, m := range x.Lookup(keys, nil) {
				if m.Blocks() > len(keys) || m.GPU < 0 || m.CPU < 0 || m.Storage < 0 || m.Predicted < 0 {
					t.Fatalf("bad match %+v", m)
				}
			}
		}
	})
}
