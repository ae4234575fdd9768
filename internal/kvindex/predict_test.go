package kvindex

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// predictionStats checks the prediction counters' invariant (every
// predicted block is confirmed, expired, cancelled or live, absent
// RemoveReplica) and the counts wanted.
func predictionStats(t *testing.T, x *Exact, predicted, confirmed, expired, live int64) {
	t.Helper()
	s := x.Stats()
	if s.Predicted != s.Confirmed+s.Expired+s.Cancelled+s.PredictedLive {
		t.Errorf("predicted %d != confirmed %d + expired %d + cancelled %d + live %d", s.Predicted, s.Confirmed, s.Expired, s.Cancelled, s.PredictedLive)
	}
	if s.Predicted != predicted || s.Confirmed != confirmed || s.Expired != expired || s.PredictedLive != live {
		t.Errorf("predicted/confirmed/expired/live = %d/%d/%d/%d, want %d/%d/%d/%d",
			s.Predicted, s.Confirmed, s.Expired, s.PredictedLive, predicted, confirmed, expired, live)
	}
}

// Two requests sharing a prefix, routed to one replica: the shared blocks
// are one prediction each, the second request's run takes them over, and
// each run is confirmed by the events that store its blocks, in order.
func TestPredictionSharedPrefix(t *testing.T) {
	x := testExact(newClock(), nil)
	a := x.AddReplica("a")
	x.AddReplica("b")
	p1 := seq(0, 32)                           // blocks A..H
	p2 := append(seq(0, 16), seq(1000, 16)...) // A..D, then E'..H'
	k1 := Keys(nil, p1, 4, Extras{Root: x.Root()})
	k2 := Keys(nil, p2, 4, Extras{Root: x.Root()})
	x.Routed(a, k1)
	x.Routed(a, k2)
	predictionStats(t, x, 12, 0, 0, 12)
	for _, p := range [][]uint32{p1, p2} {
		if m := lookupOf(x, "a", p, Extras{}); m != (Match{Predicted: 8}) {
			t.Errorf("lookup on a: %+v, want 8 predicted", m)
		}
		if m := lookupOf(x, "b", p, Extras{}); m != (Match{}) {
			t.Errorf("lookup on b: %+v, want nothing", m)
		}
	}
	// A prompt that leaves p1 after 3 blocks is covered for those 3.
	q := append(seq(0, 12), seq(5000, 20)...)
	if m := lookupOf(x, "a", q, Extras{}); m != (Match{Predicted: 3}) {
		t.Errorf("diverging prompt: %+v, want 3 predicted", m)
	}
	// The engine stores p2 in two events: confirms p2's 8 blocks.
	x.Apply("a", batch(0, storedEv(nil, []uint64{1, 2, 3}, p2[:12], "")))
	x.Apply("a", batch(0, storedEv(hp(3), []uint64{4, 15, 16, 17, 18}, p2[12:], "")))
	predictionStats(t, x, 12, 8, 0, 4)
	if m := lookupOf(x, "a", p1, Extras{}); m != (Match{GPU: 4, Predicted: 4}) {
		t.Errorf("p1 after p2 stored: %+v", m)
	}
	// Then p1's own blocks after the shared ones.
	x.Apply("a", batch(0, storedEv(hp(4), []uint64{5, 6, 7, 8}, p1[16:], "")))
	predictionStats(t, x, 12, 12, 0, 0)
	if m := lookupOf(x, "a", p1, Extras{}); m != (Match{GPU: 8}) {
		t.Errorf("p1 stored: %+v", m)
	}
}

// An event that stores a run's next block after others (a hit report from
// the first block, or another request's longer chain) confirms from there;
// events of other content or other replicas confirm nothing.
func TestPredictionConfirmMidEvent(t *testing.T) {
	x := testExact(newClock(), nil)
	a := x.AddReplica("a")
	p := seq(0, 32)
	keys := Keys(nil, p, 4, Extras{Root: x.Root()})
	x.Apply("a", batch(0, storedEv(nil, []uint64{1, 2}, p[:8], "")))
	x.Routed(a, keys) // A, B held: C..H predicted
	predictionStats(t, x, 6, 0, 0, 6)
	x.Apply("b", batch(0, storedEv(nil, []uint64{1, 2, 3, 4, 5}, p[:20], "")))
	x.Apply("a", batch(0, storedEv(nil, []uint64{9, 10}, seq(700, 8), "")))
	predictionStats(t, x, 6, 0, 0, 6)
	x.Apply("a", batch(0, storedEv(nil, []uint64{1, 2, 3, 4, 5}, p[:20], "")))
	predictionStats(t, x, 6, 3, 0, 3)
	if m := lookupOf(x, "a", p, Extras{}); m != (Match{GPU: 5, Predicted: 3}) {
		t.Errorf("after partial confirmation: %+v", m)
	}
}

// Predictions expire after PredictTTL, are evicted oldest first beyond
// MaxPredicted, and leave with their replica without counting as expired.
func TestPredictionLimits(t *testing.T) {
	c := newClock()
	x := testExact(c, func(cfg *Config) { cfg.PredictTTL = 2 * time.Second; cfg.MaxPredicted = 12 })
	a := x.AddReplica("a")
	b := x.AddReplica("b")
	k1 := Keys(nil, seq(0, 32), 4, Extras{Root: x.Root()})
	k2 := Keys(nil, seq(100, 32), 4, Extras{Root: x.Root()})
	x.Routed(a, k1)
	x.Routed(b, k2) // 16 keys > 12: a's run is evicted
	predictionStats(t, x, 16, 0, 8, 8)
	if m := lookupOf(x, "a", seq(0, 32), Extras{}); m != (Match{}) {
		t.Errorf("evicted run still counts: %+v", m)
	}
	// A prompt longer than the whole budget keeps its first blocks.
	x.Routed(a, Keys(nil, seq(200, 64), 4, Extras{Root: x.Root()}))
	predictionStats(t, x, 28, 0, 16, 12)
	if m := lookupOf(x, "a", seq(200, 64), Extras{}); m != (Match{Predicted: 12}) {
		t.Errorf("long prompt: %+v, want its first 12 blocks", m)
	}
	c.Add(3 * time.Second)
	if m := lookupOf(x, "a", seq(200, 64), Extras{}); m != (Match{}) {
		t.Errorf("expired run still counts: %+v", m)
	}
	x.Routed(b, k2) // sweeps the expired run
	predictionStats(t, x, 36, 0, 28, 8)
	x.RemoveReplica("b")
	if s := x.Stats(); s.PredictedLive != 0 || s.Expired != 28 {
		t.Errorf("after RemoveReplica: %+v", s)
	}
	id := x.AddReplica("c") // reuses b's ID
	if m := lookupOf(x, "c", seq(100, 32), Extras{}); m != (Match{}) || id != b {
		t.Errorf("replica %d reusing %d inherited %+v", id, b, m)
	}
}

// A run's longest common prefix with a prompt, galloping and bisecting
// over chained keys, equals a position-by-position scan, for every offset,
// run length, prompt length and divergence point.
func TestPredRunLCP(t *testing.T) {
	const blocks = 40
	full := Keys(nil, seq(0, blocks*4), 4, Extras{})
	for off := range int32(12) {
		for n := off + 1; n <= blocks; n++ {
			run := predRun{keys: full[off:n], k0: full[off], off: off, n: n}
			if n > off+1 {
				run.k1 = full[off+1]
			}
			for d := 0; d <= blocks; d++ { // q leaves the chain at block d
				toks := seq(0, blocks*4)
				if d < blocks {
					toks[4*d] = 1 << 20
				}
				q := Keys(nil, toks, 4, Extras{})
				for m := 0; m <= blocks; m++ {
					want := int32(0)
					if int(off) < m && q[off] == full[off] {
						want = off
						for want < min(n, int32(m)) && q[want] == full[want] {
							want++
						}
					}
					if got := run.lcp(q[:m]); got != want {
						t.Fatalf("off %d n %d diverge %d len %d: lcp %d, want %d", off, n, d, m, got, want)
					}
				}
			}
		}
	}
}

// At most maxRuns requests keep predictions; the oldest go first.
func TestPredictionRunCap(t *testing.T) {
	x := testExact(newClock(), nil)
	const replicas = 64
	for r := range replicas {
		x.AddReplica(fmt.Sprintf("r%02d", r))
	}
	for i := range maxRuns + 10 {
		x.Routed(ReplicaID(i%replicas), Keys(nil, seq(i*8, 8), 4, Extras{Root: x.Root()}))
	}
	predictionStats(t, x, 2*(maxRuns+10), 0, 20, 2*maxRuns)
	if m := lookupOf(x, "r00", seq(0, 8), Extras{}); m != (Match{}) {
		t.Errorf("oldest run kept: %+v", m)
	}
	last := maxRuns + 9
	if m := lookupOf(x, fmt.Sprintf("r%02d", last%replicas), seq(last*8, 8), Extras{}); m != (Match{Predicted: 2}) {
		t.Errorf("newest run: %+v", m)
	}
}

// Predictions past their time are expired when stats are read and before an
// event is matched, so a late BlockStored confirms nothing and the live
// gauge does not stick after traffic stops.
func TestPredictionLateEvents(t *testing.T) {
	c := newClock()
	x := testExact(c, nil)
	a := x.AddReplica("a")
	p := seq(0, 32)
	x.Routed(a, Keys(nil, p, 4, Extras{Root: x.Root()}))
	c.Add(DefaultPredictTTL + time.Second)
	predictionStats(t, x, 8, 0, 8, 0)
	x.Routed(a, Keys(nil, p, 4, Extras{Root: x.Root()}))
	c.Add(DefaultPredictTTL + time.Second)
	x.Apply("a", batch(0, storedEv(nil, []uint64{1, 2, 3, 4, 5, 6, 7, 8}, p, "")))
	predictionStats(t, x, 16, 0, 16, 0)
}

// Steady routing with 1% very long prompts and no confirmations: the memory
// the predictions hold stays bounded (dead runs do not keep long prompts'
// buffers), near the MaxPredicted keys' 8 MiB.
func TestPredictionMemoryBounded(t *testing.T) {
	c := newClock()
	x := testExact(c, nil)
	var reps []ReplicaID
	for r := range 16 {
		reps = append(reps, x.AddReplica(fmt.Sprintf("r%02d", r)))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	long := make([]Key, 8192) // a 131,072-token prompt at block size 16
	short := make([]Key, 4)
	maxBytes := int64(0)
	for i := range 50_000 {
		k := short
		if rng.IntN(100) == 0 {
			k = long
		}
		base := rng.Uint64()
		for j := range k {
			k[j] = Key(base + uint64(j))
		}
		x.Routed(reps[i%len(reps)], k)
		c.Add(1250 * time.Microsecond) // 800 routed requests/s
		if i%10_000 == 9_999 {
			maxBytes = max(maxBytes, x.Stats().Bytes)
		}
	}
	if limit := int64(3 * DefaultMaxPredicted * 8); maxBytes > limit {
		t.Errorf("Stats.Bytes reached %d MB: more than 3x the MaxPredicted keys' %d MB", maxBytes>>20, DefaultMaxPredicted*8>>20)
	}
}

// TestPredictionConfirmManyRuns: with many unconfirmed runs on one replica
// (its events stalled, then resumed), confirm finds each run's next key by
// map instead of a scan per run, with the same result: each stored prompt
// confirms its own run, and only it.
func TestPredictionConfirmManyRuns(t *testing.T) {
	x := testExact(newClock(), nil)
	a := x.AddReplica("a")
	const runs, blocks = 300, 16
	prompt := func(i int) []uint32 { return seq(i*blocks*4+1_000_000, blocks*4) }
	for i := range runs {
		x.Routed(a, Keys(nil, prompt(i), 4, Extras{Root: x.Root()}))
	}
	predictionStats(t, x, runs*blocks, 0, 0, runs*blocks)
	for i := 0; i < runs; i += 2 { // every other prompt stored, in one event each
		hs := make([]uint64, blocks)
		for j := range hs {
			hs[j] = uint64(i*blocks + j + 1)
		}
		x.Apply("a", batch(0, storedEv(nil, hs, prompt(i), "")))
	}
	predictionStats(t, x, runs*blocks, runs/2*blocks, 0, runs/2*blocks)
	for i := range runs {
		m := lookupOf(x, "a", prompt(i), Extras{})
		want := Match{Predicted: blocks}
		if i%2 == 0 {
			want = Match{GPU: blocks}
		}
		if m != want {
			t.Fatalf("prompt %d: %+v, want %+v", i, m, want)
		}
	}
}

// BenchmarkConfirmStalled is one 512-block BlockStored event on a replica
// with 4,096 unconfirmed runs it does not match (its events had stalled):
// the cost confirm adds under the index's write lock.
func BenchmarkConfirmStalled(b *testing.B) {
	x, err := NewExact(Config{Model: "m", BlockSize: 16}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	a := x.AddReplica("a")
	for i := range 4096 {
		x.Routed(a, Keys(nil, seq(i*64+1<<28, 64), 16, Extras{Root: x.Root()}))
	}
	toks := seq(1, 512*16)
	hs := make([]uint64, 512)
	for i := range hs {
		hs[i] = uint64(i + 1)
	}
	ev := storedEv(nil, hs, toks, "")
	ev.BlockSize = 16
	bt := batch(0, ev)
	b.ReportAllocs()
	for b.Loop() {
		x.Apply("a", bt)
	}
}
