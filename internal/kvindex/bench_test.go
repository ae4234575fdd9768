package kvindex

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"math/rand/v2"
	"os"
	"runtime"
	"testing"

	"kvrouter/internal/vllm"
)

// Benchmarks; numbers and commands are in docs/routing.md:
//
//	go test -run '^$' -bench . -benchtime 1x -count 1 ./internal/kvindex/

type mooncakeReq struct {
	InputLength int   `json:"input_length"`
	HashIDs     []int `json:"hash_ids"`
}

func loadMooncake(tb testing.TB, limit int) []mooncakeReq {
	f, err := os.Open("../../testdata/mooncake/conversation_trace.jsonl.gz")
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		tb.Fatal(err)
	}
	var out []mooncakeReq
	sc := bufio.NewScanner(zr)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() && len(out) < limit {
		var r mooncakeReq
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			tb.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

// expander turns Mooncake hash ids into 512 token ids each,
// deterministically: id h is a window of a fixed pseudo-random pool, so equal
// ids give equal tokens and different ids different ones.
type expander struct{ pool []uint32 }

const poolSize = 1 << 20

func newExpander() expander {
	r := rand.New(rand.NewPCG(42, 42))
	p := make([]uint32, poolSize+512)
	for i := range p {
		p[i] = uint32(r.IntN(151_000))
	}
	return expander{p}
}

func (e expander) block(h int) []uint32 {
	off := (h * 7919) % poolSize
	return e.pool[off : off+512]
}

// replayStep is a lookup (keys) or an event batch for an engine.
type replayStep struct {
	keys   []Key
	engine string
	batch  *vllm.Batch
}

// buildReplay turns the trace into the operations an index sees in a fleet
// of `replicas` engines with `capacity` blocks each (FIFO eviction), block
// size 16: per request a lookup of its keys, then the engine's BlockStored
// for the blocks it lacks and BlockRemoved for the blocks it evicts. events
// counts the stored and removed blocks; promptKeys the keys looked up, of
// which Lookup probes only those up to the first one no replica holds
// (benchReplay counts those).
func buildReplay(tb testing.TB, reqs []mooncakeReq, replicas, capacity int) (steps []replayStep, events, promptKeys int) {
	const bs = 16
	ex := newExpander()
	root := Root("mooncake", "")
	names := make([]string, replicas)
	type cache struct {
		has  map[uint64]bool
		fifo []uint64
	}
	caches := make([]cache, replicas)
	for i := range names {
		names[i] = "engine-" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		caches[i] = cache{has: map[uint64]bool{}}
	}
	var toks []uint32
	for _, r := range reqs {
		toks = toks[:0]
		for k, h := range r.HashIDs {
			n := min(512, r.InputLength-k*512)
			toks = append(toks, ex.block(h)[:max(n, 0)]...)
		}
		keys := Keys(nil, toks, bs, Extras{Root: root})
		steps = append(steps, replayStep{keys: keys})
		promptKeys += len(keys)
		rep := r.HashIDs[min(1, len(r.HashIDs)-1)] % replicas
		c := &caches[rep]
		var evs []vllm.Event
		var parent *vllm.BlockHash
		for k, h := range r.HashIDs {
			full := min(32, max(0, (r.InputLength-k*512)/bs))
			win := ex.block(h)
			var run []vllm.BlockHash
			start := 0
			flush := func() {
				if len(run) > 0 {
					evs = append(evs, vllm.Event{Type: vllm.BlockStored, BlockHashes: run, ParentBlockHash: parent,
						TokenIDs: win[start*bs : (start+len(run))*bs], BlockSize: bs})
					events += len(run)
				}
			}
			for j := range full {
				eh := uint64(h)<<8 | uint64(j) + 1
				if c.has[eh] {
					flush()
					run = nil
				} else {
					if run == nil {
						start = j
					}
					run = append(run, vllm.BlockHash(eh))
					c.has[eh] = true
					c.fifo = append(c.fifo, eh)
				}
				if c.has[eh] && run == nil {
					p := vllm.BlockHash(eh)
					parent = &p
				}
			}
			flush()
			if len(run) > 0 {
				p := run[len(run)-1]
				parent = &p
			}
		}
		var removed []vllm.BlockHash
		for len(c.fifo) > capacity {
			eh := c.fifo[0]
			c.fifo = c.fifo[1:]
			delete(c.has, eh)
			removed = append(removed, vllm.BlockHash(eh))
		}
		for _, h := range removed {
			evs = append(evs, vllm.Event{Type: vllm.BlockRemoved, BlockHashes: []vllm.BlockHash{h}})
			events++
		}
		if len(evs) > 0 {
			steps = append(steps, replayStep{engine: names[rep], batch: &vllm.Batch{Events: evs}})
		}
	}
	return steps, events, promptKeys
}

// BenchmarkMooncakeReplay replays the first 4,000 Mooncake requests on 16
// engines of 32,768 blocks as block-level operations on one core: stores
// (with re-hashing of token_ids), removals, and the keys lookups probe. A
// lookup stops at the first key no replica holds, so only the keys up to
// and including that one are probed and counted (probed-keys/replay); the
// prompts' other keys are never touched (unprobed-keys/replay) and count
// for nothing. ops/s is per wall second, ops/cpu-s per second of CPU the
// process used (GC included): on a shared machine the latter is the
// throughput of one core. index=growing starts
// from an empty index whose key table doubles as it fills; index=sized sets
// Config.ExpectedEntries to the fleet's 16 x 32,768 blocks, as a router
// told its fleet's capacity would (the steady state of a long-lived index).
func BenchmarkMooncakeReplay(b *testing.B) {
	reqs := loadMooncake(b, 4000)
	steps, events, promptKeys := buildReplay(b, reqs, 16, 32768)
	for _, bc := range []struct {
		name     string
		expected int
	}{{"growing", 0}, {"sized", 16 * 32768}} {
		b.Run("index="+bc.name, func(b *testing.B) {
			cfg := Config{Model: "mooncake", BlockSize: 16, PredictTTL: -1, ExpectedEntries: bc.expected}
			benchReplay(b, cfg, steps, events, promptKeys)
		})
	}
}

// benchReplay applies steps to a fresh index per iteration. An op is a
// stored or removed block (events) or a probed lookup key: per lookup, the
// keys up to the first that no replica holds (the longest match plus one,
// at most all of them; none before any replica exists), found from the
// lookup's result. The replay is
// deterministic, so every iteration must probe the same keys.
func benchReplay(b *testing.B, cfg Config, steps []replayStep, events, promptKeys int) {
	b.ReportAllocs()
	var last Stats
	probed := -1
	cpu := cpuTime()
	for b.Loop() {
		x, err := NewExact(cfg, nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		out := make([]Match, 0, 16)
		n := 0
		for i := range steps {
			s := &steps[i]
			if s.batch != nil {
				x.Apply(s.engine, s.batch)
				continue
			}
			out = x.Lookup(s.keys, out)
			if len(out) == 0 { // no replica yet: nothing probed
				continue
			}
			longest := 0
			for _, m := range out {
				longest = max(longest, m.Blocks())
			}
			n += min(longest+1, len(s.keys))
		}
		if probed >= 0 && n != probed {
			b.Fatalf("iterations probed %d and %d keys", probed, n)
		}
		probed = n
		last = x.Stats()
	}
	cpu = cpuTime() - cpu
	if last.UnknownParent != 0 || last.UnknownRemoved != 0 {
		b.Fatalf("replay inconsistent: %+v", last)
	}
	ops := events + probed
	b.ReportMetric(float64(ops)*float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	if cpu > 0 {
		b.ReportMetric(float64(ops)*float64(b.N)/cpu.Seconds(), "ops/cpu-s")
	}
	b.ReportMetric(float64(ops), "ops/replay")
	b.ReportMetric(float64(probed), "probed-keys/replay")
	b.ReportMetric(float64(promptKeys-probed), "unprobed-keys/replay")
	b.ReportMetric(float64(last.Entries), "entries")
	b.ReportMetric(float64(last.Stored), "stored/replay")
	b.ReportMetric(float64(last.Removed), "removed/replay")
}

// BenchmarkBytesPerEntry measures the heap held per (block, engine) entry
// with runtime.MemStats: 2^20 entries, each of 2^20/holders distinct keys
// held by 1, 2, 4 or 8 engines (4 is the smallest holder count with a holder
// record, the most expensive case).
func BenchmarkBytesPerEntry(b *testing.B) {
	for _, holders := range []int{1, 2, 4, 8} {
		b.Run("holders="+string(rune('0'+holders)), func(b *testing.B) {
			const entries, bs, perEvent = 1 << 20, 16, 32
			ex := newExpander()
			var perEntry float64
			for b.Loop() {
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				x, _ := NewExact(Config{BlockSize: bs, PredictTTL: -1}, nil, nil)
				toks := make([]uint32, perEvent*bs)
				keys := entries / holders
				for e := range holders {
					name := "engine-" + string(rune('a'+e))
					for k := 0; k < keys; k += perEvent {
						hs := make([]vllm.BlockHash, perEvent)
						for j := range hs {
							hs[j] = vllm.BlockHash(k + j + 1)
						}
						// Distinct chains of 32 blocks: tokens from the pool,
						// the first one numbering the chain (the pool's
						// windows repeat after 65,536 chains).
						copy(toks, ex.pool[(k*bs)%poolSize:])
						toks[0] = uint32(k)
						x.Apply(name, &vllm.Batch{Events: []vllm.Event{{Type: vllm.BlockStored, BlockHashes: hs,
							TokenIDs: toks, BlockSize: bs}}})
					}
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				n := x.Stats().Entries
				perEntry = float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
				runtime.KeepAlive(x)
			}
			b.ReportMetric(perEntry, "B/entry")
		})
	}
}
