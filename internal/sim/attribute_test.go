package sim

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"kvrouter/internal/routing"
	"kvrouter/internal/workload"
)

// TestAttributeSplit: 12 pairs of requests on 2 idle replicas, each pair a
// 1,024-token prompt then, 5 s later (the first long finished), the same
// prompt plus 64 tokens. The pooled bound hits 1,024 tokens of every second
// request (64 whole blocks, under the n-1 rule) and nothing else. kv puts
// each second request with its prefix: nothing lost. kv with every overlap
// weight 0 is blind to the cache, so the second request goes by load, and
// the loads are equal: at random. Each one placed on the other replica
// loses 1,024 tokens to Split (the replica it left held them); none is
// lost otherwise.
func TestAttributeSplit(t *testing.T) {
	w := &workload.Workload{Name: "pairs"}
	for i := range 12 {
		at := time.Duration(i) * 20 * time.Second
		a := workload.Segment{Key: uint64(100 + i), Len: 1024}
		w.Requests = append(w.Requests,
			workload.Request{ID: fmt.Sprintf("a%d", i), At: at, Prompt: []workload.Segment{a}, OutputTokens: 8},
			workload.Request{ID: fmt.Sprintf("b%d", i), At: at + 5*time.Second, Prompt: []workload.Segment{a, {Key: uint64(200 + i), Len: 64}}, OutputTokens: 8})
	}
	for _, blind := range []bool{false, true} {
		cfg := Config{Replicas: 2, Policies: []string{"kv"}, Seed: 3}
		if blind {
			cfg.Routing.KV = routing.KVConfig{GPUWeight: -1, PredictedWeight: -1, CPUWeight: -1, StorageWeight: -1}
		}
		_, as, b, err := Attribute(t.Context(), cfg, w)
		if err != nil {
			t.Fatal(err)
		}
		if b.CachedTokens != 12*1024 || len(as) != 1 {
			t.Fatalf("bound %d tokens, %d attributions", b.CachedTokens, len(as))
		}
		runs, err := Run(t.Context(), cfg, w)
		if err != nil {
			t.Fatal(err)
		}
		split := 0
		for i := 0; i < len(w.Requests); i += 2 {
			if s := runs[0].Samples; s[i].Replica != s[i+1].Replica {
				split++
			}
		}
		a := as[0]
		want := Attribution{Policy: "kv", Bound: 12 * 1024, Cached: int64(12-split) * 1024, Split: int64(split) * 1024, SplitRequests: split}
		if a != want {
			t.Errorf("blind %v: attribution %+v, want %+v", blind, a, want)
		}
		md := AttributionMarkdown(as)
		if row := fmt.Sprintf("| kv | %.3f | %.3f (0.000) | 0.000 | 0.000 | 0.000 | %d / 0 |\n", float64(12-split)/12, float64(split)/12, split); !strings.Contains(md, row) {
			t.Errorf("markdown lacks %q:\n%s", row, md)
		}
		if blind && (split == 0 || split == 12) {
			t.Errorf("blind: %d of 12 split: the test does not exercise both cases", split)
		}
		if !blind && split != 0 {
			t.Errorf("kv split %d pairs", split)
		}
	}
}
