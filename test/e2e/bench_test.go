package e2e

import (
	"context"
	"encoding/json"
	"net"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/enginesim"
)

// startEngine runs an engine-sim with fast timing on loopback until the
// test ends.
func startEngine(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := enginesim.New(enginesim.Config{Core: enginesim.CoreConfig{Profile: enginesim.ProfileFast}, ServedModelName: "m"}, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return "http://" + ln.Addr().String()
}

func TestBenchAgainstEngineSims(t *testing.T) {
	a, b := startEngine(t), startEngine(t)
	code, out, errs := runCmd(t, "bench", "--engines", a+","+b, "--policies", "round_robin,least_load", "--reset",
		"--workload", "shared_prefix", "--groups", "4", "--requests", "40", "--rate", "200", "--prefix-tokens", "256",
		"--suffix-tokens", "32", "--output-tokens", "8", "--bound-blocks", "4096", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var rep reportJSON
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(rep.Policies) != 2 || rep.Policies[0].Name != "round_robin" || rep.Policies[0].Requests != 40 || rep.Policies[0].Errors != 0 {
		t.Fatalf("report %s", out)
	}
	// --bound-blocks 4096: the pooled-cache bound of 2 engines x 4,095
	// usable blocks, with each run's share of it. 4 groups of 256-token
	// prefixes over 40 requests: the bound hits from each group's second
	// request on.
	if pb := rep.PooledBound; pb == nil || pb.GPUBlocks != 8190 || pb.HitRate <= 0 || rep.Policies[0].Share == nil || rep.Policies[1].Share == nil {
		t.Errorf("no pooled-cache bound for 2 engines of 4096 blocks: %s", out)
	}
	var raw struct {
		Policies []map[string]any `json:"policies"`
	}
	json.Unmarshal([]byte(out), &raw)
	if _, ok := raw.Policies[0]["engine_hit_rate"]; !ok {
		t.Errorf("no engine hit rate from /metrics: %v", raw.Policies[0])
	}
	if code, _, _ := runCmd(t, "bench", "--router", a, "--engines", b); code != 2 {
		t.Errorf("--router with --engines: exit %d, want 2", code)
	}
}

// reportJSON is the stable schema of --json.
type reportJSON struct {
	Policies []struct {
		Name     string  `json:"name"`
		Requests int     `json:"requests"`
		Errors   int     `json:"errors"`
		HitRate  float64 `json:"hit_rate"`
		TTFT     struct {
			P50, P90, P99 float64
		} `json:"ttft_ms"`
		ITL struct {
			P50, P90, P99 float64
		} `json:"itl_ms"`
		Throughput  float64  `json:"throughput_tok_s"`
		Goodput     float64  `json:"goodput_rps"`
		MaxMeanLoad float64  `json:"max_mean_load"`
		Share       *float64 `json:"share_of_pooled_bound"`
	} `json:"policies"`
	PooledBound *struct {
		HitRate   float64 `json:"hit_rate"`
		GPUBlocks int     `json:"gpu_blocks"`
	} `json:"pooled_bound"`
	Workload struct {
		Name     string `json:"name"`
		Requests int    `json:"requests"`
	} `json:"workload"`
}
