package sim

import (
	"slices"
	"testing"

	"kvrouter/internal/enginesim"
	"kvrouter/internal/workload"
)

// TestPooledBoundLoRA: the adapter's name is an extra key of every block
// (as the fleet's engines cache them), so the same 64-token prompt under
// adapter a, then b, then a again hits only the third time: 60 tokens (the
// n-1 rule in 4-token blocks). Before the bound passed the name on, the
// second request hit too.
func TestPooledBoundLoRA(t *testing.T) {
	w := &workload.Workload{Name: "lora"}
	for i, lora := range []string{"a", "b", "a"} {
		w.Requests = append(w.Requests, workload.Request{ID: string(rune('x' + i)), Prompt: []workload.Segment{{Key: 9, Len: 64}}, OutputTokens: 1, LoRA: lora})
	}
	cfg := Config{Replicas: 1, Engine: enginesim.CoreConfig{BlockSize: 4, NumGPUBlocks: 200, MaxModelLen: 128}}
	b, err := PooledBound(t.Context(), cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{0, 0, 60}; !slices.Equal(b.CachedPerRequest, want) {
		t.Fatalf("cached %v, want %v", b.CachedPerRequest, want)
	}
}
