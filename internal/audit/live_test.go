package audit

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/enginesim"
	"kvrouter/internal/promtest"
)

// fleet is a group of in-process engine-sims serving one model on loopback
// (no KV events: audit reads only /metrics).
type fleet struct {
	model string
	urls  []string
}

func startFleet(t *testing.T, model string, n, blocks int) fleet {
	t.Helper()
	f := fleet{model: model}
	for range n {
		srv, err := enginesim.New(enginesim.Config{
			Core:            enginesim.CoreConfig{Profile: enginesim.ProfileFast, MaxModelLen: min(32768, (blocks-1)*16), NumGPUBlocks: blocks},
			ServedModelName: model,
		}, nil, prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- srv.Serve(ctx, ln) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("engine-sim: %v", err)
			}
		})
		f.urls = append(f.urls, "http://"+ln.Addr().String())
	}
	return f
}

func (f fleet) targets() []string {
	var out []string
	for _, u := range f.urls {
		out = append(out, strings.TrimPrefix(u, "http://"))
	}
	return out
}

// complete sends one completion to an engine (one token per UTF-8 byte).
func complete(ctx context.Context, c *http.Client, url, model, prompt string, maxTokens int) error {
	body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":%d}`, model, prompt, maxTokens)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return fmt.Errorf("%s: %d %s", url, resp.StatusCode, b)
	}
	return nil
}

func text(r *rand.Rand, n int) string {
	const letters = "abcdefghijklmnopqrstuvwxyz "
	b := make([]byte, n)
	for i := range b {
		b[i] = letters[r.IntN(len(letters))]
	}
	return string(b)
}

// traffic drives the fleets like a blind balancer (uniformly random
// replica per request) with one kind of traffic each until ctx ends.
func traffic(ctx context.Context, t *testing.T, wg *sync.WaitGroup, f fleet, kind string, workers int) {
	c := &http.Client{Timeout: 30 * time.Second}
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.CloseIdleConnections()
			r := rand.New(rand.NewPCG(uint64(w), uint64(len(kind))))
			system := text(rand.New(rand.NewPCG(7, 7)), 1500)
			var conv string
			turns := 0
			for ctx.Err() == nil {
				url := f.urls[r.IntN(len(f.urls))]
				var prompt string
				maxTokens := 4
				switch kind {
				case "unique":
					prompt = text(r, 600)
				case "shared":
					prompt = system + text(r, 60)
				case "conversations":
					// A conversation grows by a turn each request; a new one
					// starts after four turns.
					if turns == 0 {
						conv = text(r, 200)
					}
					conv += text(r, 150)
					turns = (turns + 1) % 4
					prompt = conv
				case "thrash":
					prompt, maxTokens = text(r, 500), 300
				}
				if err := complete(ctx, c, url, f.model, prompt, maxTokens); err != nil && ctx.Err() == nil {
					t.Errorf("%s: %v", kind, err)
					return
				}
			}
		}()
	}
}

// TestAuditVerdictsLive: a real Prometheus scrapes five fleets of
// engine-sims, each driven by a blind balancer with one kind of traffic,
// and the audit must give each its verdict: unique prompts -> low_reuse, a
// shared system prompt -> already_high, conversations -> worth_it, one
// replica -> one_replica, a cache too small for its load -> thrashing.
// The same audit from the engines' /metrics directly agrees.
func TestAuditVerdictsLive(t *testing.T) {
	promtest.Tool(t, "prometheus")
	fleets := map[string]fleet{
		"unique":        startFleet(t, "unique", 3, 4096),
		"shared":        startFleet(t, "shared", 3, 4096),
		"conversations": startFleet(t, "conversations", 6, 4096),
		"solo":          startFleet(t, "solo", 1, 4096),
		"thrash":        startFleet(t, "thrash", 2, 80),
	}
	// An old engine (vLLM before the gpu_ names were removed), idle.
	old := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, oldEngine) }))
	t.Cleanup(old.Close)
	jobs := []promtest.Job{{Name: "old", Targets: []string{strings.TrimPrefix(old.URL, "http://")}}}
	n := 1
	for k, f := range fleets {
		jobs = append(jobs, promtest.Job{Name: k, Targets: f.targets()})
		n += len(f.urls)
	}
	prom := promtest.Start(t, time.Second, jobs)
	prom.WaitTargetsUp(t, n, 30*time.Second)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for k, f := range fleets {
		kind, workers := k, 2
		switch k {
		case "solo":
			kind = "shared"
		case "thrash":
			workers = 6
		}
		traffic(ctx, t, &wg, f, kind, workers)
	}
	start := time.Now()
	// Sample the engines directly while the traffic runs.
	var direct Report
	var derr error
	func() {
		var all []string
		for _, k := range []string{"unique", "shared", "conversations", "solo", "thrash"} {
			all = append(all, fleets[k].urls...)
		}
		all = append(all, old.URL)
		direct, derr = FromEngines(ctx, SampleConfig{Engines: all, Window: 8 * time.Second, Samples: 3})
	}()
	time.Sleep(3 * time.Second) // two more scrapes of the last traffic
	stop()
	wg.Wait()
	if derr != nil {
		t.Fatal(derr)
	}
	window := time.Since(start)
	viaProm, err := FromPrometheus(context.Background(), PromConfig{URL: prom.URL, Window: window})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Verdict{"old": NoTraffic, "unique": LowReuse, "shared": AlreadyHigh, "conversations": WorthIt, "solo": OneReplica, "thrash": Thrashing}
	for _, r := range []Report{viaProm, direct} {
		var b strings.Builder
		if err := r.WriteText(&b); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s", b.String())
		got := map[string]Verdict{}
		for _, m := range r.Models {
			got[m.Model] = m.Verdict
			if m.Model != "old" && len(m.Replicas) != len(fleets[m.Model].urls) {
				t.Errorf("%s: %s: %d replicas, want %d", r.Source, m.Model, len(m.Replicas), len(fleets[m.Model].urls))
			}
		}
		if len(r.Warnings) != 2 || !strings.Contains(r.Warnings[0], "vllm:gpu_cache_usage_perc") || !strings.Contains(r.Warnings[1], "vllm:gpu_prefix_cache_hit_rate") {
			t.Errorf("%s: warnings %q, want the two removed metrics of the old engine", r.Source, r.Warnings)
		}
		for model, v := range want {
			if got[model] != v {
				t.Errorf("%s: %s: verdict %q, want %q", r.Source, model, got[model], v)
			}
		}
	}
}

// oldEngine is an exposition with the names older vLLM versions used
// (vllm:gpu_cache_usage_perc, vllm:gpu_prefix_cache_*), hand-written.
const oldEngine = `# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="old"} 0.25
# TYPE vllm:gpu_prefix_cache_hit_rate gauge
vllm:gpu_prefix_cache_hit_rate{model_name="old"} 0.5
# TYPE vllm:gpu_prefix_cache_queries_total counter
vllm:gpu_prefix_cache_queries_total{model_name="old"} 1000
# TYPE vllm:gpu_prefix_cache_hits_total counter
vllm:gpu_prefix_cache_hits_total{model_name="old"} 500
`
