package proxy

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"kvrouter/internal/config"
	"kvrouter/internal/fleet"
)

// TestAdapterLoadPrefersFreeSlot: an adapter no engine has is loaded on an
// engine with a free LoRA slot (vllm:lora_requests_info: max_lora minus
// the adapters running or waiting), not on one whose batch is full, even
// when the router would pick the full one; with no slot free anywhere,
// every engine stays a candidate.
func TestAdapterLoadPrefersFreeSlot(t *testing.T) {
	rg := newRig(t, 2, func(c *config.Config, fc *fleet.Config) {
		c.Models[0].AdapterLoading = config.AdapterLoadingLoad
		c.Models[0].Adapters = []config.Adapter{{Name: "b", Path: "/adapters/b"}, {Name: "c", Path: "/adapters/c"}}
		fc.ScrapeInterval = 10 * time.Millisecond
	})
	var mu sync.Mutex
	running := map[string]string{"e0": "a", "e1": ""} // e0's one slot holds adapter a
	loads := map[string]int{}
	for _, e := range rg.engines {
		orig := e.srv.Config.Handler
		e.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			defer mu.Unlock()
			switch r.URL.Path {
			case "/metrics":
				fmt.Fprintf(w, "# TYPE vllm:lora_requests_info gauge\nvllm:lora_requests_info{max_lora=\"1\",running_lora_adapters=%q,waiting_lora_adapters=\"\"} 1.7e9\n", running[e.name])
			case "/v1/load_lora_adapter":
				loads[e.name]++
			default:
				mu.Unlock()
				orig.ServeHTTP(w, r)
				mu.Lock()
			}
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rg.fleet.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	deadline := time.Now().Add(5 * time.Second)
	for {
		k0, ok0 := rg.fleet.Endpoint("e0").FreeLoRASlots()
		k1, ok1 := rg.fleet.Endpoint("e1").FreeLoRASlots()
		if ok0 && ok1 && k0 == 0 && k1 == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slots not scraped: e0 %d %v, e1 %d %v", k0, ok0, k1, ok1)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The router picks the first candidate: e0 unless it is left out.
	resp := rg.post("/v1/chat/completions", `{"model":"b","messages":[{"role":"user","content":"hi"}]}`)
	out := readAll(t, resp)
	mu.Lock()
	got := map[string]int{"e0": loads["e0"], "e1": loads["e1"]}
	running["e1"] = "b" // now both batches are full
	mu.Unlock()
	if resp.StatusCode != 200 || resp.Header.Get("X-Kvrouter-Replica") != "e1" || got["e1"] != 1 || got["e0"] != 0 {
		t.Fatalf("load with e0 full: %d on %s %s, loads %v", resp.StatusCode, resp.Header.Get("X-Kvrouter-Replica"), out, got)
	}
	deadline = time.Now().Add(5 * time.Second)
	for k, _ := rg.fleet.Endpoint("e1").FreeLoRASlots(); k != 0; k, _ = rg.fleet.Endpoint("e1").FreeLoRASlots() {
		if time.Now().After(deadline) {
			t.Fatal("e1's full batch not scraped")
		}
		time.Sleep(5 * time.Millisecond)
	}
	resp = rg.post("/v1/chat/completions", `{"model":"c","messages":[{"role":"user","content":"hi"}]}`)
	if out := readAll(t, resp); resp.StatusCode != 200 || resp.Header.Get("X-Kvrouter-Replica") != "e0" {
		t.Fatalf("no slot free: %d on %s %s, want the router's pick e0", resp.StatusCode, resp.Header.Get("X-Kvrouter-Replica"), out)
	}
}
