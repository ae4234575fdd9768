package enginesim

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestLoRAAdapters: adapters listed with their parent, loaded at run time
// after the load delay, refused twice, and keyed apart from the base model:
// equal text under an adapter and the base shares no block.
func TestLoRAAdapters(t *testing.T) {
	s := startServer(t, Config{ServedModelName: "base", LoRAModules: []string{"sql"}, AllowRuntimeLoRA: true,
		LoRALoadDelay: 50 * time.Millisecond, MaxLoRAs: 2})
	prompt := strings.Repeat("hello world ", 10) // 120 tokens: 112 reusable
	cached := func(model string) int {
		t.Helper()
		resp, body := post(t, s.url+"/v1/completions", map[string]any{"model": model, "prompt": prompt, "max_tokens": 1})
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", model, resp.StatusCode, body)
		}
		var out completionOut
		if err := json.Unmarshal(body, &out); err != nil {
			t.Fatal(err)
		}
		return out.Usage.PromptTokensDetails.CachedTokens
	}
	if c := cached("base"); c != 0 {
		t.Fatalf("first base request cached %d", c)
	}
	if c := cached("sql"); c != 0 {
		t.Fatalf("adapter after base with equal text: cached %d, want 0 (the adapter name is an extra key)", c)
	}
	if c := cached("sql"); c != 112 {
		t.Fatalf("adapter repeated: cached %d, want 112", c)
	}
	if resp, _ := post(t, s.url+"/v1/completions", map[string]any{"model": "math", "prompt": "x"}); resp.StatusCode != 404 {
		t.Fatalf("unknown adapter: %d, want 404", resp.StatusCode)
	}
	t0 := time.Now()
	resp, body := post(t, s.url+"/v1/load_lora_adapter", map[string]any{"lora_name": "math", "lora_path": "/adapters/math"})
	if resp.StatusCode != 200 || !strings.Contains(string(body), "math") || time.Since(t0) < 50*time.Millisecond {
		t.Fatalf("load: %d %q after %v", resp.StatusCode, body, time.Since(t0))
	}
	for _, req := range []map[string]any{{"lora_name": "math", "lora_path": "/adapters/math"}, {"lora_name": "x"}} {
		if resp, body := post(t, s.url+"/v1/load_lora_adapter", req); resp.StatusCode != 400 {
			t.Errorf("load %v: %d %s, want 400", req, resp.StatusCode, body)
		}
	}
	if c := cached("math"); c != 0 {
		t.Fatalf("new adapter: cached %d", c)
	}
	hresp, err := http.Get(s.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer hresp.Body.Close()
	body, _ = io.ReadAll(hresp.Body)
	resp = hresp
	var list struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil || resp.StatusCode != 200 {
		t.Fatalf("%v %s", err, body)
	}
	parents := map[string]string{}
	for _, c := range list.Data {
		p := "<nil>"
		if c.Parent != nil {
			p = *c.Parent
		}
		parents[c.ID] = p
	}
	if want := map[string]string{"base": "<nil>", "sql": "base", "math": "base"}; len(parents) != 3 || parents["sql"] != "base" || parents["math"] != "base" || parents["base"] != "<nil>" {
		t.Errorf("models %v, want %v", parents, want)
	}
	if n := testutil.CollectAndCount(s.reg, "vllm:lora_requests_info"); n != 1 {
		t.Errorf("lora_requests_info series: %d", n)
	}
	if v := testutil.ToFloat64(s.m.loraLoads); v != 1 {
		t.Errorf("lora loads %v, want 1", v)
	}
}

func TestLoRAActive(t *testing.T) {
	c, err := NewCore(CoreConfig{Profile: ProfileFast, NumGPUBlocks: 64, MaxNumSeqs: 1, MaxModelLen: 512})
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range []string{"b", "a", "a"} {
		if err := c.Submit(&Request{ID: string(rune('x' + i)), Tokens: []uint32{1, 2, 3}, MaxTokens: 5, LoRAName: l}); err != nil {
			t.Fatal(err)
		}
	}
	c.Step()
	run, wait := c.ActiveLoRAs()
	if strings.Join(run, ",") != "b" || strings.Join(wait, ",") != "a" {
		t.Errorf("running %v waiting %v, want [b] [a]", run, wait)
	}
}

func TestLoRALoadNotAllowed(t *testing.T) {
	s := startServer(t, Config{})
	if resp, _ := post(t, s.url+"/v1/load_lora_adapter", map[string]any{"lora_name": "a", "lora_path": "/a"}); resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("runtime loading off: %d, want 404", resp.StatusCode)
	}
	if n := testutil.CollectAndCount(s.reg, "vllm:lora_requests_info"); n != 0 {
		t.Errorf("LoRA off: %d lora_requests_info series", n)
	}
}
