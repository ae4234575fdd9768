package proxy

import (
	"math/rand/v2"
	"testing"
	"time"

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
	b.Observe("a", enginemetrics.Metrics{BlockSize: 64}, time.Now())
	if b.BlockSize() != 64 {
		t.Error("block size from metrics not learned")
	}
}

// TestBackendDryRunAndExclusion: a dry run charges nothing; candidates
// outside RouteInput.Candidates are never chosen.
func TestBackendDryRunAndExclusion(t *testing.T) {
	b := newTestBackend(t, "kv")
	prompt := seq(320)
	b.Apply(stored(prompt, 16))
	d, err := b.Route(&RouteInput{Model: "m", Tokens: prompt, Candidates: []string{"a", "b"}, DryRun: true})
	if err != nil || d.Release != nil || d.Replica != "b" || d.CachedTokens != 320 {
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
	b := newTestBackend(t, PolicyShadow)
	prompt := seq(320)
	b.Apply(stored(prompt, 16))
	served := map[string]int{}
	for range 4 {
		d, err := b.Route(&RouteInput{Model: "m", Tokens: prompt, Candidates: []string{"a", "b"}})
		if err != nil {
			t.Fatal(err)
		}
		served[d.Replica]++
		if d.Shadow == nil || d.Shadow.Replica != "b" || d.Shadow.CachedTokens != 320 {
			t.Errorf("shadow %+v, want b with 320 cached", d.Shadow)
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
