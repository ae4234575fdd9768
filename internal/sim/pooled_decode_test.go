package sim

import (
	"reflect"
	"testing"

	"kvrouter/internal/enginesim"
	"kvrouter/internal/workload"
)

// TestPooledBoundDecodeAloneIdentical: the pooled bound with each
// request's decode run by enginesim.Core.DecodeAlone equals, to the request,
// the bound with every decode step run through Step (as before DecodeAlone):
// on the whole Mooncake trace for the 8-replica fleet, and on its first 2,000
// records with small caches (evictions, a CPU tier, rejected requests).
func TestPooledBoundDecodeAloneIdentical(t *testing.T) {
	if testing.Short() {
		t.Skip("computes the Mooncake trace's pooled bound twice")
	}
	full, err := workload.Mooncake(trace(t), workload.MooncakeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	part, err := workload.Mooncake(trace(t), workload.MooncakeOptions{Limit: 2000})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		cfg  Config
		w    *workload.Workload
	}{
		{"mooncake/8", Config{Replicas: 8}, full},
		{"small/cpu", Config{Replicas: 2, Engine: enginesim.CoreConfig{NumGPUBlocks: 3000, NumCPUBlocks: 1500, MaxModelLen: 32768}}, part},
	} {
		t.Run(c.name, func(t *testing.T) {
			fast, err := pooledBound(t.Context(), c.cfg, c.w, false)
			if err != nil {
				t.Fatal(err)
			}
			stepped, err := pooledBound(t.Context(), c.cfg, c.w, true)
			if err != nil {
				t.Fatal(err)
			}
			if fast.CachedTokens == 0 || !reflect.DeepEqual(fast, stepped) {
				t.Fatalf("DecodeAlone: hit rate %.6f (%d cached), stepped %.6f (%d)", fast.HitRate, fast.CachedTokens, stepped.HitRate, stepped.CachedTokens)
			}
			t.Logf("hit rate %.4f, %d cached tokens", fast.HitRate, fast.CachedTokens)
		})
	}
}
