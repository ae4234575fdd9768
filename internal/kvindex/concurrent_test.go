package kvindex

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"kvrouter/internal/vllm"
)

// concChains is the number of distinct token chains the engines of
// TestExactConcurrentApply store; each chain is concLen blocks of size 4.
const (
	concChains  = 12
	concLen     = 6
	concEngines = 4
	concRounds  = 300
)

func concTokens(c int) []uint32 { return seq(c*1000, concLen*4) }

// concBatches is engine e's deterministic event stream: round r stores chain
// r%concChains (a duplicate or hit report when already held), removes the
// chain half the ring away, and every 37th round clears the engine.
func concBatches(e int) []*vllm.Batch {
	hashes := func(c int) []uint64 {
		h := make([]uint64, concLen)
		for i := range h {
			h[i] = uint64(e)<<32 | uint64(c)<<8 | uint64(i+1)
		}
		return h
	}
	var out []*vllm.Batch
	for r := range concRounds {
		c, old := r%concChains, (r+concChains/2)%concChains
		evs := []vllm.Event{
			storedEv(nil, hashes(c), concTokens(c), ""),
			removedEv("", hashes(old)...),
		}
		if r%37 == 36 {
			evs = append(evs, vllm.Event{Type: vllm.AllBlocksCleared})
		}
		out = append(out, batch(0, evs...))
	}
	return out
}

// TestExactConcurrentApply applies four engines' event streams from four
// goroutines (one per subscriber, as the server does) while other
// goroutines Lookup, predict (Routed, RoutedMatch) and add and remove a
// replica. Under -race it proves Apply safe for concurrent use; afterwards
// the index must equal one built by applying the same streams one after the
// other, and a replica that reuses a removed replica's ID must inherit none
// of its predictions.
func TestExactConcurrentApply(t *testing.T) {
	c := newClock()
	x := testExact(c, func(cfg *Config) { cfg.PredictTTL = time.Minute })
	ref := testExact(c, func(cfg *Config) { cfg.PredictTTL = -1 })
	names := make([]string, concEngines)
	streams := make([][]*vllm.Batch, concEngines)
	for e := range names {
		names[e] = fmt.Sprint("e", e)
		x.AddReplica(names[e])
		ref.AddReplica(names[e])
		streams[e] = concBatches(e)
	}
	keys := make([][]Key, concChains)
	for ch := range keys {
		keys[ch] = Keys(nil, concTokens(ch), 4, Extras{Root: x.Root()})
	}

	var writers, readers sync.WaitGroup
	stop := make(chan struct{})
	// After every eighth batch a writer waits until the readers have predicted
	// again, so predictions land between stores (and later stores confirm
	// some) however the goroutines are scheduled. The readers run until
	// the writers are done, so the wait always ends.
	waitReaders := func() {
		for p := x.Stats().Predicted; x.Stats().Predicted == p; {
			runtime.Gosched()
		}
	}
	for e := range concEngines {
		writers.Go(func() {
			for i, b := range streams[e] {
				x.Apply(names[e], b)
				if i%8 == 7 {
					waitReaders()
				}
			}
		})
	}
	for g := range 2 {
		readers.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			var out []Match
			for {
				select {
				case <-stop:
					return
				default:
				}
				ks := keys[rng.IntN(concChains)]
				out = x.Lookup(ks, out)
				for _, m := range out {
					if m.Blocks() > concLen {
						t.Errorf("match %+v longer than the chain", m)
						return
					}
				}
				// Predict the chain for an engine: later stores confirm it.
				id := ReplicaID(rng.IntN(len(out)))
				if g == 0 {
					x.Routed(id, ks)
				} else {
					x.RoutedMatch(id, ks, out[id])
				}
			}
		})
	}
	readers.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			id := x.AddReplica("tmp")
			x.Routed(id, keys[0])
			x.RemoveReplica("tmp")
		}
	})
	writers.Wait()
	close(stop)
	readers.Wait()

	for e := range concEngines {
		for _, b := range streams[e] {
			ref.Apply(names[e], b)
		}
	}
	// A newcomer reusing "tmp"'s ID sees nothing predicted.
	id := x.AddReplica("new")
	for ch := range concChains {
		if m := lookupOf(x, "new", concTokens(ch), Extras{}); m != (Match{}) {
			t.Errorf("replica %d reusing a removed ID inherited %+v on chain %d", id, m, ch)
		}
	}
	// Predictions expired, the concurrent index equals the sequential one.
	c.Add(2 * time.Minute)
	for ch := range concChains {
		for _, n := range names {
			got, want := lookupOf(x, n, concTokens(ch), Extras{}), lookupOf(ref, n, concTokens(ch), Extras{})
			if got != want {
				t.Errorf("chain %d on %s: concurrent %+v, sequential %+v", ch, n, got, want)
			}
		}
	}
	s, rs := x.Stats(), ref.Stats()
	if s.Entries != rs.Entries || s.Stored != rs.Stored || s.Removed != rs.Removed || s.Cleared != rs.Cleared {
		t.Errorf("stats: concurrent %+v, sequential %+v", s, rs)
	}
	if s.Predicted == 0 || s.Confirmed == 0 {
		t.Errorf("the test exercised no confirmations: %+v", s)
	}
}
