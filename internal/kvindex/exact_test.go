package kvindex

import (
	"testing"
	"time"

	"kvrouter/internal/vllm"
)

// Tokens 0..15 form four blocks of size 4: A B C D. Engine hashes 1..4.
var abcd = seq(0, 16)

func TestExactEvents(t *testing.T) {
	g1 := 1
	tests := []struct {
		name    string
		batches []*vllm.Batch
		want    Match // replica "e" for abcd
		check   func(t *testing.T, s Stats)
	}{
		{"store chain in one event", []*vllm.Batch{batch(0, storedEv(nil, []uint64{1, 2, 3, 4}, abcd, ""))},
			Match{GPU: 4}, nil},
		{"store chained across events via parent hash", []*vllm.Batch{
			batch(0, storedEv(nil, []uint64{1, 2}, abcd[:8], "GPU")),
			batch(0, storedEv(hp(2), []uint64{3}, abcd[8:12], "GPU")),
		}, Match{GPU: 3}, nil},
		{"unknown parent is counted and skipped", []*vllm.Batch{
			batch(0, storedEv(nil, []uint64{1}, abcd[:4], "")),
			batch(0, storedEv(hp(99), []uint64{3}, abcd[8:12], "")),
		}, Match{GPU: 1}, func(t *testing.T, s Stats) {
			if s.UnknownParent != 1 {
				t.Errorf("UnknownParent = %d", s.UnknownParent)
			}
		}},
		{"medium tiers: CPU run after GPU blocks", []*vllm.Batch{
			batch(0, storedEv(nil, []uint64{1, 2}, abcd[:8], "GPU")),
			batch(0, storedEv(hp(2), []uint64{3, 4}, abcd[8:], "CPU")),
		}, Match{GPU: 2, CPU: 2}, nil},
		{"offloaded copy keeps best tier; GPU removal falls back to CPU", []*vllm.Batch{
			batch(0, storedEv(nil, []uint64{1, 2}, abcd[:8], "GPU")),
			batch(0, storedEv(nil, []uint64{1, 2}, abcd[:8], "CPU")),
			batch(0, removedEv("GPU", 2)),
		}, Match{GPU: 1, CPU: 1}, nil},
		{"duplicate copies are reference counted", []*vllm.Batch{
			batch(0, storedEv(nil, []uint64{1, 2}, abcd[:8], "")),
			batch(0, storedEv(hp(1), []uint64{2}, abcd[4:8], "")),
			batch(0, removedEv("", 2)),
		}, Match{GPU: 2}, func(t *testing.T, s Stats) {
			if s.Duplicates != 1 || s.Removed != 0 {
				t.Errorf("Duplicates %d Removed %d", s.Duplicates, s.Removed)
			}
		}},
		{"hit report refreshes, adds no copy", []*vllm.Batch{
			batch(0, storedEv(nil, []uint64{1, 2}, abcd[:8], "")),
			batch(0, storedEv(nil, []uint64{1, 2}, abcd[:8], "")), // kv_cache_report_mode full
			batch(0, removedEv("", 2)),
		}, Match{GPU: 1}, func(t *testing.T, s Stats) {
			if s.HitReports != 2 || s.Removed != 1 {
				t.Errorf("HitReports %d Removed %d", s.HitReports, s.Removed)
			}
		}},
		{"removal of unknown hash is counted", []*vllm.Batch{
			batch(0, storedEv(nil, []uint64{1}, abcd[:4], "")),
			batch(0, removedEv("", 7)),
		}, Match{GPU: 1}, func(t *testing.T, s Stats) {
			if s.UnknownRemoved != 1 {
				t.Errorf("UnknownRemoved %d", s.UnknownRemoved)
			}
		}},
		{"AllBlocksCleared drops only that rank", []*vllm.Batch{
			batch(0, storedEv(nil, []uint64{1, 2}, abcd[:8], "")),
			batch(1, storedEv(nil, []uint64{11}, abcd[:4], "")),
			batch(0, vllm.Event{Type: vllm.AllBlocksCleared}),
		}, Match{GPU: 1}, func(t *testing.T, s Stats) {
			if s.Cleared != 2 || s.Entries != 1 {
				t.Errorf("Cleared %d Entries %d", s.Cleared, s.Entries)
			}
		}},
		{"other attention groups are not indexed", []*vllm.Batch{
			batch(0, func() vllm.Event {
				e := storedEv(nil, []uint64{1}, abcd[:4], "")
				e.KVCacheSpecKind, e.GroupIdx = "sliding_window", &g1
				return e
			}()),
		}, Match{}, func(t *testing.T, s Stats) {
			if s.OtherGroups != 1 {
				t.Errorf("OtherGroups %d", s.OtherGroups)
			}
		}},
		{"wrong block size is counted and skipped", []*vllm.Batch{
			batch(0, func() vllm.Event {
				e := storedEv(nil, []uint64{1}, abcd[:4], "")
				e.BlockSize = 16
				return e
			}()),
		}, Match{}, func(t *testing.T, s Stats) {
			if s.Mismatched != 1 {
				t.Errorf("Mismatched %d", s.Mismatched)
			}
		}},
		{"tokenless offload of a known block", []*vllm.Batch{
			batch(0, storedEv(nil, []uint64{1}, abcd[:4], "")),
			batch(0, storedEv(nil, []uint64{1}, nil, "STORAGE")),
			batch(0, removedEv("GPU", 1)),
		}, Match{Storage: 1}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x := testExact(newClock(), nil)
			for _, b := range tc.batches {
				x.Apply("e", b)
			}
			if got := lookupOf(x, "e", abcd, Extras{}); got != tc.want {
				t.Fatalf("Match = %+v, want %+v", got, tc.want)
			}
			if tc.check != nil {
				tc.check(t, x.Stats())
			}
		})
	}
}

func TestExactResetAndRemoveReplica(t *testing.T) {
	x := testExact(newClock(), nil)
	x.Apply("a", batch(0, storedEv(nil, []uint64{1, 2}, abcd[:8], "")))
	x.Apply("a", batch(1, storedEv(nil, []uint64{1}, abcd[:4], "")))
	x.Apply("b", batch(0, storedEv(nil, []uint64{1, 2, 3}, abcd[:12], "")))
	x.Reset("a", 0)
	if m := lookupOf(x, "a", abcd, Extras{}); m.GPU != 1 {
		t.Fatalf("after reset of rank 0, a holds %+v, want rank 1's one block", m)
	}
	if m := lookupOf(x, "b", abcd, Extras{}); m.GPU != 3 {
		t.Fatalf("reset of a touched b: %+v", m)
	}
	if !x.RemoveReplica("b") || x.RemoveReplica("b") {
		t.Fatal("RemoveReplica must report presence once")
	}
	if s := x.Stats(); s.Entries != 1 || s.Replicas != 1 {
		t.Fatalf("stats after removal: %+v", s)
	}
	// The freed ID is reused, with nothing of b's left behind.
	if id := x.AddReplica("c"); id != 1 {
		t.Fatalf("reused id = %d", id)
	}
	if m := lookupOf(x, "c", abcd, Extras{}); m != (Match{}) {
		t.Fatalf("new replica inherited %+v", m)
	}
}

func TestExactLeadingRunOnly(t *testing.T) {
	// Replica holds A and C but not B: only A leads. B+A on another:
	// "A cached on r1 and B on r2: a request B+A goes to r2".
	x := testExact(newClock(), nil)
	x.Apply("r1", batch(0, storedEv(nil, []uint64{1}, abcd[:4], "")))
	x.Apply("r2", batch(0, storedEv(nil, []uint64{2}, abcd[4:8], "")))
	req := append(append([]uint32{}, abcd[4:8]...), abcd[:4]...) // B then A
	if m := lookupOf(x, "r1", req, Extras{}); m.Blocks() != 0 {
		t.Fatalf("r1 holds A, which is not a prefix of B+A: %+v", m)
	}
	if m := lookupOf(x, "r2", req, Extras{}); m.Blocks() != 1 {
		t.Fatalf("r2 holds B: %+v", m)
	}
}

func TestExactCapEvictsLRU(t *testing.T) {
	x := testExact(newClock(), func(c *Config) { c.MaxEntries = 3 })
	x.Apply("e", batch(0, storedEv(nil, []uint64{1, 2}, abcd[:8], "")))
	x.Apply("e", batch(0, storedEv(nil, []uint64{11, 12}, seq(100, 8), "")))
	s := x.Stats()
	if s.Entries != 3 || s.Evicted != 1 {
		t.Fatalf("Entries %d Evicted %d", s.Entries, s.Evicted)
	}
	// The least recent is the deep block of the first event.
	if m := lookupOf(x, "e", abcd, Extras{}); m.GPU != 1 {
		t.Fatalf("first prefix: %+v, want block A kept and B evicted", m)
	}
	// A hit report refreshes: now the second chain is older.
	x.Apply("e", batch(0, storedEv(nil, []uint64{1}, abcd[:4], "")))
	x.Apply("e", batch(0, storedEv(nil, []uint64{21}, seq(200, 4), "")))
	if m := lookupOf(x, "e", abcd, Extras{}); m.GPU != 1 {
		t.Fatalf("refreshed block evicted: %+v", m)
	}
	if s := x.Stats(); s.Bytes <= 0 {
		t.Fatalf("Bytes = %d", s.Bytes)
	}
}

func TestExactPredictions(t *testing.T) {
	c := newClock()
	x := testExact(c, func(cfg *Config) { cfg.PredictTTL = 2 * time.Second })
	a := x.AddReplica("a")
	x.AddReplica("b")
	keys := Keys(nil, abcd, 4, Extras{Root: x.Root()})
	x.Routed(a, keys)
	if m := lookupOf(x, "a", abcd, Extras{}); m.Predicted != 4 {
		t.Fatalf("predicted: %+v", m)
	}
	// The engine reports two of the blocks: confirmed, counted as GPU.
	x.Apply("a", batch(0, storedEv(nil, []uint64{1, 2}, abcd[:8], "")))
	if m := lookupOf(x, "a", abcd, Extras{}); m != (Match{GPU: 2, Predicted: 2}) {
		t.Fatalf("after confirmation: %+v", m)
	}
	// Routing again predicts only the blocks not held.
	x.Routed(a, keys)
	c.Add(3 * time.Second)
	if m := lookupOf(x, "a", abcd, Extras{}); m != (Match{GPU: 2}) {
		t.Fatalf("after expiry: %+v", m)
	}
	x.Routed(a, keys) // sweeps the expired ones, predicts C and D again
	s := x.Stats()
	if s.Predicted != 6 || s.Confirmed != 2 || s.Expired != 2 || s.ConfirmationRate() != 0.5 {
		t.Fatalf("prediction stats %+v rate %v", s, s.ConfirmationRate())
	}
}

func TestExactPredictionOff(t *testing.T) {
	x := testExact(newClock(), func(c *Config) { c.PredictTTL = -1 })
	a := x.AddReplica("a")
	x.Routed(a, Keys(nil, abcd, 4, Extras{Root: x.Root()}))
	if m := lookupOf(x, "a", abcd, Extras{}); m != (Match{}) {
		t.Fatalf("prediction off, got %+v", m)
	}
}

func TestLookupNoAlloc(t *testing.T) {
	c := newClock()
	x := testExact(c, nil)
	x.Apply("a", batch(0, storedEv(nil, []uint64{1, 2, 3, 4}, abcd, "")))
	b := x.AddReplica("b")
	keys := Keys(nil, abcd, 4, Extras{Root: x.Root()})
	x.Routed(b, keys)
	out := make([]Match, 0, 8)
	if n := testing.AllocsPerRun(100, func() { out = x.Lookup(keys, out) }); n != 0 {
		t.Fatalf("Lookup allocated %v times", n)
	}
}

func TestConfigErrors(t *testing.T) {
	_, err := NewExact(Config{BlockSize: -1, MaxEntries: -1, ApproxTTL: -1}, nil, nil)
	if err == nil {
		t.Fatal("want errors")
	}
}

// TestExactCapClock checks the CLOCK eviction of Exact's cap: stores and
// hit reports mark entries hot, the hand cools hot entries and evicts the
// first cold one, so an entry reported since the hand's last pass outlives
// colder ones; freed entries are skipped and the cap always holds.
func TestExactCapClock(t *testing.T) {
	x := testExact(newClock(), func(c *Config) { c.MaxEntries = 4 })
	blocks := make([][]uint32, 10)
	store := func(i int) {
		blocks[i] = seq(1000*(i+1), 4)
		x.Apply("e", batch(0, storedEv(nil, []uint64{uint64(i + 1)}, blocks[i], "")))
	}
	held := func(i int) bool { return lookupOf(x, "e", blocks[i], Extras{}).GPU == 1 }
	check := func(step string, want ...int) {
		t.Helper()
		if s := x.Stats(); s.Entries > 4 {
			t.Fatalf("%s: Entries %d over the cap", step, s.Entries)
		}
		in := map[int]bool{}
		for _, i := range want {
			in[i] = true
		}
		for i := range blocks {
			if blocks[i] != nil && held(i) != in[i] {
				t.Fatalf("%s: block %d held %v, want %v", step, i, held(i), in[i])
			}
		}
	}
	for i := range 5 {
		store(i)
	}
	// The fifth store found every entry hot: the hand cooled them all and
	// evicted the first one, block 0.
	check("five stores", 1, 2, 3, 4)
	// Block 2 is reported again (hot); the next stores evict the cold
	// blocks 1 and 3, passing over block 2.
	x.Apply("e", batch(0, storedEv(nil, []uint64{3}, blocks[2], "")))
	store(5)
	store(6)
	check("after the report", 2, 4, 5, 6)
	// A removed entry is freed; the cap keeps holding as stores go on.
	x.Apply("e", batch(0, removedEv("", 5)))
	check("after the removal", 2, 5, 6)
	for i := 7; i < 10; i++ {
		store(i)
	}
	// Evictions: one per store from the fifth on (3), none for the store
	// that refilled the removed entry's room, then two.
	if s := x.Stats(); s.Entries != 4 || s.Evicted != 5 {
		t.Fatalf("Entries %d Evicted %d, want 4 and 5", s.Entries, s.Evicted)
	}
	if !held(9) || !held(8) {
		t.Fatal("the latest stores were evicted")
	}
}
