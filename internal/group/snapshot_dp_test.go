package group

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"kvrouter/internal/kvindex"
	"kvrouter/internal/vllm"
	"kvrouter/internal/vllm/kvevents"
)

// TestBackendRestoreDPRanks: a data-parallel engine (dp_size 2, its ranks
// routed as e0#dp0 and e0#dp1) restarts from the snapshot with each rank's
// entries and marks, so its subscriber replays each rank from its own last
// batch: the restored index equals the one that kept running, entry by
// entry, and a second Resume adds nothing.
func TestBackendRestoreDPRanks(t *testing.T) {
	cfg := BackendConfig{Model: "m", Replicas: []string{"e0", "e1"}, DPSize: map[string]int{"e0": 2}, Exact: true}
	src, err := NewBackend(cfg, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	stored := func(rank int, hs ...vllm.BlockHash) vllm.Batch { // as vLLM's batch names its rank
		toks := make([]uint32, 16*len(hs))
		for i := range toks {
			toks[i] = uint32(hs[0])*1000 + uint32(i)
		}
		return vllm.Batch{DataParallelRank: rank, Events: []vllm.Event{{Type: vllm.BlockStored, BlockHashes: hs, TokenIDs: toks, BlockSize: 16}}}
	}
	src.Apply(kvevents.Update{Engine: "e0", Rank: 0, Seq: 4, Sum: 40, Batch: stored(0, 1, 2)})
	src.Apply(kvevents.Update{Engine: "e0", Rank: 1, Seq: 7, Sum: 70, Batch: stored(1, 3, 4, 5)})
	src.Apply(kvevents.Update{Engine: "e1", Rank: 0, Seq: 2, Sum: 20, Batch: stored(0, 6)})
	snap := src.Snapshot()

	// As serve starts: no engines yet; each engine resumes, then the pool
	// adds it with its dp_size.
	b, err := NewBackend(BackendConfig{Model: "m", Exact: true}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Restore(snap); err != nil {
		t.Fatal(err)
	}
	if got, want := b.Resume("e0"), map[int]kvevents.Position{0: {Seq: 4, Sum: 40}, 1: {Seq: 7, Sum: 70}}; len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("resume e0: %v, want %v", got, want)
	}
	b.AddReplica("e0", 2)
	if got := b.Resume("e1"); len(got) != 1 || got[0] != (kvevents.Position{Seq: 2, Sum: 20}) {
		t.Fatalf("resume e1: %v", got)
	}
	b.AddReplica("e1", 1)
	got, want := b.Snapshot(), src.Snapshot()
	if !sameEngines(got, want) {
		t.Fatalf("restored index\n%+v\nwant\n%+v", got.Engines, want.Engines)
	}
	want6 := src.IndexStats()
	if n := b.IndexStats(); n.Entries != want6.Entries || n.Entries == 0 {
		t.Fatalf("%d entries, want %d", n.Entries, want6.Entries)
	}
	b.Resume("e0") // the snapshot's part enters once
	if n := b.IndexStats(); n.Entries != want6.Entries {
		t.Fatalf("%d entries after a second resume, want %d", n.Entries, want6.Entries)
	}
}

// sameEngines compares two snapshots' engines (name, rank marks, entries
// per group), entry by entry, in name order.
func sameEngines(a, b *kvindex.Snapshot) bool {
	sorted := func(s *kvindex.Snapshot) []kvindex.EngineSnapshot {
		es := slices.Clone(s.Engines)
		slices.SortFunc(es, func(x, y kvindex.EngineSnapshot) int { return strings.Compare(x.Name, y.Name) })
		return es
	}
	return len(a.Engines) > 0 && reflect.DeepEqual(sorted(a), sorted(b))
}
