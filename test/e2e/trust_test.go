package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"kvrouter/internal/vllm"
)

// forgedStored is a BlockStored for the first n whole 16-token blocks of
// prompt, as an event publisher that never ran the prompt could send it.
func forgedStored(prompt []uint32, blocks int, salt uint64) vllm.Event {
	ev := vllm.Event{Type: vllm.BlockStored, BlockSize: 16, Medium: "GPU", TokenIDs: prompt[:16*blocks]}
	for i := range blocks {
		ev.BlockHashes = append(ev.BlockHashes, vllm.BlockHash(salt<<16|uint64(i)))
	}
	return ev
}

// trustPrompt is a 400-token prompt unique to i.
func trustPrompt(i int) []uint32 {
	p := make([]uint32, 400)
	for j := range p {
		p[j] = uint32(1000 + 7919*i + j)
	}
	return p
}

func promptJSON(p []uint32) string {
	var b strings.Builder
	for i, v := range p {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(int(v)))
	}
	return fmt.Sprintf(`{"model":"m","prompt":[%s],"max_tokens":2}`, b.String())
}

// TestForgedEventsDistrusted: a publisher on e0's KV event port (a real
// ZeroMQ PUB the router subscribes to) announces 23 blocks (368 tokens) of
// prompts e0 never saw. Each such prompt goes to e0 with 368 cached tokens
// predicted, and e0 (an engine-sim) reports 0 in
// usage.prompt_tokens_details.cached_tokens. After 3 such answers in a row
// the router stops trusting e0's index entries: the error is exported
// (kvrouter_proxy_cached_prediction_error_tokens), the distrust is counted
// and shown (kvrouter_proxy_index_distrusts_total,
// kvrouter_proxy_index_distrusted), and a further forged prompt is routed
// with no predicted hit (by load alone).
func TestForgedEventsDistrusted(t *testing.T) {
	pub := newEventsPub(t)
	e0, e1 := startE2ESim(t), startE2ESim(t)
	e0.events = pub.ep
	r := startE2ERouterWait(t, "/ready", "tokenizer: none\npolicy: kv", e0, e1)
	pub.waitSubscribed()
	e2eEventually(t, 20*time.Second, "a batch of e0's publisher applied", func() bool {
		pub.publish("", 1, vllm.Event{Type: vllm.AllBlocksCleared})
		return e2eMetric(t, r.url, "kvrouter_vllm_batches_total", `engine="e0"`) >= 1
	})
	forge := func(i int) {
		before := e2eMetric(t, r.url, "kvrouter_vllm_blocks_stored_total", `engine="e0"`)
		pub.publish("", 2, forgedStored(trustPrompt(i), 23, uint64(i)))
		e2eEventually(t, 20*time.Second, "forged blocks applied", func() bool {
			return e2eMetric(t, r.url, "kvrouter_vllm_blocks_stored_total", `engine="e0"`) >= before+23
		})
	}
	for i := range 3 {
		forge(i)
		resp, body := r.post("/v1/completions", promptJSON(trustPrompt(i)))
		if resp.StatusCode != 200 {
			t.Fatalf("prompt %d: %d %s", i, resp.StatusCode, body)
		}
		if got, cached := resp.Header.Get("X-Kvrouter-Replica"), resp.Header.Get("X-Kvrouter-Cached-Tokens"); got != "e0" || cached != "368" {
			t.Fatalf("forged prompt %d went to %s with %s cached tokens predicted, want e0 with 368", i, got, cached)
		}
		if !strings.Contains(body, `"cached_tokens":0`) {
			t.Fatalf("prompt %d: e0 did not report 0 cached tokens: %s", i, body)
		}
	}
	if n := e2eMetric(t, r.url, "kvrouter_proxy_cached_prediction_error_tokens_count", `replica="e0"`); n != 3 {
		t.Errorf("prediction errors observed on e0: %v, want 3", n)
	}
	if s := e2eMetric(t, r.url, "kvrouter_proxy_cached_prediction_error_tokens_sum", `replica="e0"`); s != 3*368 {
		t.Errorf("prediction error sum on e0: %v, want %d", s, 3*368)
	}
	if n := e2eMetric(t, r.url, "kvrouter_proxy_index_distrusts_total", `replica="e0"`); n != 1 {
		t.Errorf("kvrouter_proxy_index_distrusts_total{replica=e0} = %v, want 1", n)
	}
	if n := e2eMetric(t, r.url, "kvrouter_proxy_index_distrusted", `replica="e0"`); n != 1 {
		t.Errorf("kvrouter_proxy_index_distrusted{replica=e0} = %v, want 1", n)
	}
	forge(3)
	resp, body := r.post("/v1/completions", promptJSON(trustPrompt(3)))
	if resp.StatusCode != 200 || resp.Header.Get("X-Kvrouter-Cached-Tokens") != "0" {
		t.Fatalf("a forged prompt after the distrust: %d on %s with %s cached tokens predicted, want 0 (routed by load): %s",
			resp.StatusCode, resp.Header.Get("X-Kvrouter-Replica"), resp.Header.Get("X-Kvrouter-Cached-Tokens"), body)
	}
}
