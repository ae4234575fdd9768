package group

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"kvrouter/internal/config"
	"kvrouter/internal/kvindex"
	"kvrouter/internal/routing"
	"kvrouter/internal/vllm"
	"kvrouter/internal/vllm/enginemetrics"
	"kvrouter/internal/vllm/kvevents"
)

func seq(n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(1000 + i)
	}
	return out
}

// stored is a BlockStored batch of tokens (whole blocks) from rank 0.
func stored(tokens []uint32, blockSize int) kvevents.Update {
	n := len(tokens) / blockSize
	hashes := make([]vllm.BlockHash, n)
	for i := range hashes {
		hashes[i] = vllm.BlockHash(i + 1)
	}
	return kvevents.Update{Engine: "b", Batch: vllm.Batch{Events: []vllm.Event{{
		Type: vllm.BlockStored, BlockHashes: hashes, TokenIDs: tokens[:n*blockSize], BlockSize: blockSize,
	}}}}
}

func newTestBackend(t *testing.T, policy string) *Backend {
	t.Helper()
	b, err := NewBackend(BackendConfig{Model: "m", Replicas: []string{"a", "b"}, Exact: true, Policy: policy,
		Routing: routing.Config{Rand: rand.New(rand.NewPCG(1, 2))}}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestBackendLearnsBlockSize: events of 32-token blocks rebuild the index
// (default 16); the router then finds the prefix on the engine that stored
// it.
func TestBackendLearnsBlockSize(t *testing.T) {
	b := newTestBackend(t, "kv")
	if b.BlockSize() != 16 {
		t.Fatalf("initial block size %d", b.BlockSize())
	}
	prompt := seq(640)
	b.Apply(stored(prompt, 32)) // rebuilds, then applies
	if b.BlockSize() != 32 || b.rebuilds.Load() != 1 {
		t.Fatalf("block size %d after 32-token events (%d rebuilds)", b.BlockSize(), b.rebuilds.Load())
	}
	d, err := b.Route(&RouteInput{Model: "m", Tokens: append(prompt, 1, 2, 3), Candidates: []string{"a", "b"}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Release()
	if d.Replica != "b" || d.CachedTokens != 640 {
		t.Errorf("routed to %s with %d cached tokens, want b with 640", d.Replica, d.CachedTokens)
	}
	// The same size from metrics changes nothing; another size rebuilds.
	b.Observe("a", enginemetrics.Metrics{BlockSize: 32, Waiting: 2}, time.Now())
	if b.rebuilds.Load() != 1 {
		t.Error("same block size rebuilt the index")
	}
	// One engine disagreeing with another that reports the current size
	// is a misconfiguration: warned, nothing rebuilt, however often.
	for range 3 {
		b.Observe("a", enginemetrics.Metrics{BlockSize: 64}, time.Now())
	}
	if b.BlockSize() != 32 || b.rebuilds.Load() != 1 {
		t.Errorf("block size %d after a disagreeing engine (%d rebuilds), want 32 kept", b.BlockSize(), b.rebuilds.Load())
	}
	// Once every engine reports the new size, it is learned.
	b.Observe("b", enginemetrics.Metrics{BlockSize: 64}, time.Now())
	if b.BlockSize() != 64 || b.rebuilds.Load() != 2 {
		t.Errorf("block size %d (%d rebuilds), want 64 learned once", b.BlockSize(), b.rebuilds.Load())
	}
}

// TestBackendDryRunAndExclusion: a dry run charges nothing; candidates
// outside RouteInput.Candidates are never chosen.
func TestBackendDryRunAndExclusion(t *testing.T) {
	b := newTestBackend(t, "kv")
	prompt := seq(320)
	b.Apply(stored(prompt, 16))
	d, err := b.Route(&RouteInput{Model: "m", Tokens: prompt, Candidates: []string{"a", "b"}, DryRun: true})
	if err != nil || d.Release != nil || d.Replica != "b" || d.CachedTokens != 304 { // a fully cached prompt: the engine computes its last block
		t.Fatalf("dry run: %+v %v", d, err)
	}
	if l, _ := b.cur.Load().router.Load("b"); l.InFlight != 0 {
		t.Errorf("dry run charged load: %+v", l)
	}
	d, err = b.Route(&RouteInput{Model: "m", Tokens: prompt, Candidates: []string{"a"}})
	if err != nil || d.Replica != "a" {
		t.Fatalf("b excluded: %+v %v", d, err)
	}
	if l, _ := b.cur.Load().router.Load("a"); l.InFlight != 1 {
		t.Errorf("lease not charged: %+v", l)
	}
	d.FirstToken()
	d.Release()
	d.Release()
	if l, _ := b.cur.Load().router.Load("a"); l.InFlight != 0 || l.QueuedPrefill != 0 || l.RunningDecode != 0 {
		t.Errorf("load after release: %+v", l)
	}
}

// TestBackendShadow: shadow mode serves round_robin and reports what kv
// would have chosen and found cached.
func TestBackendShadow(t *testing.T) {
	b := newTestBackend(t, config.PolicyShadow)
	prompt := seq(320)
	b.Apply(stored(prompt, 16))
	served := map[string]int{}
	for range 4 {
		d, err := b.Route(&RouteInput{Model: "m", Tokens: prompt, Candidates: []string{"a", "b"}})
		if err != nil {
			t.Fatal(err)
		}
		served[d.Replica]++
		if d.Shadow == nil || d.Shadow.Replica != "b" || d.Shadow.CachedTokens != 304 {
			t.Errorf("shadow %+v, want b with 304 cached (all but the last block)", d.Shadow)
		}
		d.Release()
	}
	if served["a"] != 2 || served["b"] != 2 {
		t.Errorf("round_robin served %v", served)
	}
}

// TestBackendReset: a subscriber reset drops the engine's entries.
func TestBackendReset(t *testing.T) {
	b := newTestBackend(t, "kv")
	prompt := seq(320)
	b.Apply(stored(prompt, 16))
	b.Apply(kvevents.Update{Engine: "b", Reset: kvevents.ResetRestart})
	d, err := b.Route(&RouteInput{Model: "m", Tokens: prompt, Candidates: []string{"a", "b"}, DryRun: true})
	if err != nil || d.CachedTokens != 0 {
		t.Errorf("after reset: %+v %v", d, err)
	}
}

// TestExplainTerms: the explain record means the same under every policy:
// new_tokens = prompt - cached_tokens; cost (with its unit) only for
// policies that compute one; the shadow decision serialises snake_case.
func TestExplainTerms(t *testing.T) {
	prompt := append(seq(1408), 1, 2, 3, 4, 5, 6, 7, 8, 9) // 1417 tokens, 88 blocks of 16 cached on b
	for _, tc := range []struct {
		policy, unit string
		credits      bool
	}{
		{"round_robin", "", false}, {"random", "", false}, {"kv", "seconds", true},
		{"least_load", "requests", false}, {"dynamo", "blocks", true}, {config.PolicyShadow, "", false},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			b := newTestBackend(t, tc.policy)
			b.Apply(stored(prompt, 16))
			d, err := b.Route(&RouteInput{Model: "m", Tokens: prompt, Candidates: []string{"a", "b"}, DryRun: true})
			if err != nil {
				t.Fatal(err)
			}
			raw, err := json.Marshal(struct {
				Shadow  *ShadowDecision `json:"shadow,omitempty"`
				Explain any             `json:"explain"`
			}{d.Shadow, d.Explain})
			if err != nil {
				t.Fatal(err)
			}
			var got struct {
				Shadow  map[string]any `json:"shadow"`
				Explain struct {
					CostUnit   string           `json:"cost_unit"`
					Candidates []map[string]any `json:"candidates"`
				} `json:"explain"`
			}
			if err := json.Unmarshal(raw, &got); err != nil {
				t.Fatal(err)
			}
			if got.Explain.CostUnit != tc.unit {
				t.Errorf("cost_unit %q, want %q", got.Explain.CostUnit, tc.unit)
			}
			for _, c := range got.Explain.Candidates {
				cached, newTok := c["cached_tokens"].(float64), c["new_tokens"].(float64)
				want := 0.0
				if c["replica"] == "b" {
					want = 1408
				}
				if cached != want || newTok != float64(len(prompt))-want {
					t.Errorf("%s: %s", tc.policy, raw)
				}
				if _, ok := c["cost"]; ok != (tc.unit != "") {
					t.Errorf("cost present %v, want %v: %s", ok, tc.unit != "", raw)
				}
				if _, ok := c["credited_tokens"]; ok != tc.credits {
					t.Errorf("credited_tokens present %v, want %v: %s", ok, tc.credits, raw)
				}
			}
			if tc.policy == config.PolicyShadow {
				if got.Shadow["replica"] != "b" || got.Shadow["cached_tokens"] != 1408.0 {
					t.Errorf("shadow %s", raw)
				}
			}
		})
	}
}

// TestBackendSizesIndexFromMetrics: the engines' num_gpu_blocks (times
// their DP ranks) size the exact index's key table once their sum outgrows
// it, keeping what it holds; a configured expected_entries turns it off.
func TestBackendSizesIndexFromMetrics(t *testing.T) {
	b := newTestBackend(t, "kv")
	prompt := seq(320)
	b.Apply(stored(prompt, 16))
	before := b.cur.Load().exact.Stats().Bytes
	b.Observe("a", enginemetrics.Metrics{BlockSize: 16, NumGPUBlocks: 100_000}, time.Now())
	b.Observe("b", enginemetrics.Metrics{BlockSize: 16, NumGPUBlocks: 50_000, Engines: 2}, time.Now())
	g := b.cur.Load()
	if g.reserved.Load() != 200_000 {
		t.Fatalf("reserved %d entries, want 200,000", g.reserved.Load())
	}
	// 200,000 entries at a load <= 3/4: 262,144 slots of 5 bytes.
	if after := g.exact.Stats().Bytes; after-before < 262_144*5-16*5 {
		t.Errorf("index bytes %d -> %d: key table not sized", before, after)
	}
	d, err := b.Route(&RouteInput{Model: "m", Tokens: prompt, Candidates: []string{"a", "b"}, DryRun: true})
	if err != nil || d.Replica != "b" || d.CachedTokens != 304 {
		t.Errorf("after sizing: %+v %v, want b with 304 cached tokens", d, err)
	}

	// Engines scraped concurrently (-race).
	var wg sync.WaitGroup
	for e := range 8 {
		wg.Go(func() {
			b.Observe(fmt.Sprint("e", e), enginemetrics.Metrics{BlockSize: 16, NumGPUBlocks: 1000 + e}, time.Now())
		})
	}
	wg.Wait()

	// A configured dp_size counts when the engine's metrics label fewer
	// ranks (one process per rank behind one URL).
	dp, err := NewBackend(BackendConfig{Model: "m", Replicas: []string{"a"}, Exact: true, DPSize: map[string]int{"a": 4}}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	dp.Observe("a", enginemetrics.Metrics{BlockSize: 16, NumGPUBlocks: 1000, Engines: 1}, time.Now())
	if r := dp.cur.Load().reserved.Load(); r != 4000 {
		t.Errorf("dp_size 4 x 1,000 blocks: reserved %d, want 4,000", r)
	}

	fixed, err := NewBackend(BackendConfig{Model: "m", Replicas: []string{"a"}, Exact: true,
		Index: kvindex.Config{ExpectedEntries: 1000}}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	fixed.Observe("a", enginemetrics.Metrics{BlockSize: 16, NumGPUBlocks: 100_000}, time.Now())
	if r := fixed.cur.Load().reserved.Load(); r != 0 {
		t.Errorf("configured expected_entries, yet reserved %d from metrics", r)
	}
}

// TestEngineHit: the reported hit is whole blocks, at most prompt-1 tokens,
// as vLLM's prefix cache gives it.
func TestEngineHit(t *testing.T) {
	for _, c := range []struct{ blocks, bs, prompt, want int }{
		{50, 16, 800, 784}, // fully cached, block-aligned: one block less
		{50, 16, 801, 800}, // the last token is in a partial block
		{10, 16, 800, 160},
		{0, 16, 800, 0},
		{3, 16, 0, 48}, // prompt unknown
		{1, 16, 16, 0},
	} {
		if got := engineHit(c.blocks, c.bs, c.prompt); got != c.want {
			t.Errorf("engineHit(%d, %d, %d) = %d, want %d", c.blocks, c.bs, c.prompt, got, c.want)
		}
	}
}

// TestBackendApproxCapacityFromMetrics: without KV events the approximate
// index holds at most an engine's scraped num_gpu_blocks (times its DP
// ranks), and a rebuild for a new block size keeps the capacity of every
// engine already reporting that size instead of the 65,536-block default.
func TestBackendApproxCapacityFromMetrics(t *testing.T) {
	b, err := NewBackend(BackendConfig{Model: "m", Replicas: []string{"a", "b"}, Policy: "kv",
		Routing: routing.Config{Rand: rand.New(rand.NewPCG(1, 2))}}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	held := func(engine string, prompt []uint32) int {
		t.Helper()
		if _, err := b.Route(&RouteInput{Model: "m", Tokens: prompt, Candidates: []string{engine}}); err != nil {
			t.Fatal(err)
		}
		g := b.cur.Load()
		id, _ := g.approx.ReplicaID(engine)
		return g.approx.ReplicaBlocks(id)
	}
	b.Observe("a", enginemetrics.Metrics{BlockSize: 16, NumGPUBlocks: 10, Engines: 2}, time.Now())
	if n := held("a", seq(16*50)); n != 20 {
		t.Fatalf("engine a (2 ranks x 10 blocks) holds %d blocks of a 50-block prompt, want 20", n)
	}
	// b restarts with 32-token blocks: the group disagrees (a still says
	// 16), so no rebuild yet; then a does too: rebuilt for 32, and b's
	// capacity, reported before the rebuild, still holds.
	b.Observe("b", enginemetrics.Metrics{BlockSize: 32, NumGPUBlocks: 7}, time.Now())
	b.Observe("a", enginemetrics.Metrics{BlockSize: 32, NumGPUBlocks: 9}, time.Now())
	if b.BlockSize() != 32 || b.rebuilds.Load() != 1 {
		t.Fatalf("block size %d after %d rebuilds, want 32 after 1", b.BlockSize(), b.rebuilds.Load())
	}
	if n := held("b", seq(32*30)); n != 7 {
		t.Fatalf("engine b holds %d blocks of a 30-block prompt after the rebuild, want its 7", n)
	}
	if n := held("a", seq(32*30)); n != 9 {
		t.Fatalf("engine a holds %d blocks after the rebuild, want 9", n)
	}
}

// TestBackendCapacityReachesRouter: the engines' num_gpu_blocks (per DP
// rank) become the router's capacities, so kv charges cache pressure on a
// full engine and none on one with room; a rebuild for a new block size
// keeps them.
func TestBackendCapacityReachesRouter(t *testing.T) {
	b := newTestBackend(t, "kv")
	b.Observe("a", enginemetrics.Metrics{BlockSize: 16, NumGPUBlocks: 10}, time.Now())
	b.Observe("b", enginemetrics.Metrics{BlockSize: 16, NumGPUBlocks: 100_000}, time.Now())
	check := func(when string) {
		t.Helper()
		// 320 prompt tokens, 256 output tokens (the default), and the
		// prompt again for a conversation: 56 blocks, over a's 10.
		d, err := b.cur.Load().router.Evaluate(&routing.Request{Tokens: seq(320), SessionKey: "s"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ev := map[string]float64{}
		for _, tm := range d.Terms {
			ev[tm.Name] = tm.Evict
		}
		if !(ev["a"] > 0) || ev["b"] != 0 {
			t.Errorf("%s: eviction costs %v, want a > 0 (10 blocks), b = 0 (100,000)", when, ev)
		}
	}
	check("after the scrape")
	b.Observe("a", enginemetrics.Metrics{BlockSize: 32, NumGPUBlocks: 5}, time.Now())
	b.Observe("b", enginemetrics.Metrics{BlockSize: 32, NumGPUBlocks: 50_000}, time.Now())
	check("after the rebuild for 32-token blocks")
}
