package kvindexprom

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"kvrouter/internal/kvindex"
	"kvrouter/internal/vllm"
)

func TestCollector(t *testing.T) {
	reg := prometheus.NewRegistry()
	x, err := kvindex.NewExact(kvindex.Config{Model: "m", BlockSize: 2}, nil, Wrap(reg))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kvindex.NewApprox(kvindex.Config{Model: "m", BlockSize: 2}, nil, Wrap(reg)); err != nil {
		t.Fatal("exact and approx must share a registry:", err)
	}
	x.Apply("e", &vllm.Batch{Events: []vllm.Event{{Type: vllm.BlockStored, BlockHashes: []vllm.BlockHash{1, 2},
		TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2}}})
	want := `
# HELP kvrouter_kvindex_entries Current (block, engine rank) entries.
# TYPE kvrouter_kvindex_entries gauge
kvrouter_kvindex_entries{index="approx",model="m",pool=""} 0
kvrouter_kvindex_entries{index="exact",model="m",pool=""} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kvrouter_kvindex_entries"); err != nil {
		t.Fatal(err)
	}
	if n, _ := testutil.GatherAndCount(reg); n < 20 {
		t.Fatalf("only %d series", n)
	}
}
