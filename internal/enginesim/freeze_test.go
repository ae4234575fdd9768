package enginesim

import (
	"bufio"
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"kvrouter/internal/vllm/enginemetrics"
)

// scrapeMetrics reads the server's /metrics as a router does.
func scrapeMetrics(t *testing.T, url string) enginemetrics.Metrics {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	m, err := enginemetrics.Parse(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestFreeze: POST /admin/freeze hangs the core as a stuck vLLM core: a
// streamed chat gets its headers at once but no body byte, /health answers
// 200 and /metrics answers with the counters and gauges of before the
// freeze; duration=0s thaws it and the request completes, the role chunk
// first.
func TestFreeze(t *testing.T) {
	s := startServer(t, Config{})
	if resp, _ := post(t, s.url+"/v1/completions", map[string]any{"prompt": "warm up", "max_tokens": 3}); resp.StatusCode != 200 {
		t.Fatalf("warm-up: %d", resp.StatusCode)
	}
	before := scrapeMetrics(t, s.url)
	if resp, body := post(t, s.url+"/admin/freeze?duration=1m", nil); resp.StatusCode != 200 {
		t.Fatalf("freeze: %d %s", resp.StatusCode, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/v1/chat/completions",
		strings.NewReader(`{"messages":[{"role":"user","content":"hello there"}],"max_tokens":4,"stream":true}`))
	resp, err := http.DefaultClient.Do(req) // returns with the headers
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("frozen stream: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	first := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(resp.Body).ReadString('\n')
		first <- line
	}()
	for range 3 { // the API server keeps answering, its figures frozen
		h, err := http.Get(s.url + "/health")
		if err != nil || h.StatusCode != 200 {
			t.Fatalf("/health while frozen: %v %v", h, err)
		}
		h.Body.Close()
		if got := scrapeMetrics(t, s.url); got.PromptTokens != before.PromptTokens || got.GenerationTokens != before.GenerationTokens ||
			got.PrefixCacheQueries != before.PrefixCacheQueries || got.Running != before.Running || got.Waiting != before.Waiting {
			t.Fatalf("metrics moved while frozen: %+v, before %+v", got, before)
		}
	}
	select {
	case line := <-first:
		t.Fatalf("a body byte while frozen: %q", line)
	default:
	}
	if resp, body := post(t, s.url+"/admin/freeze?duration=0s", nil); resp.StatusCode != 200 {
		t.Fatalf("thaw: %d %s", resp.StatusCode, body)
	}
	if line := <-first; !strings.HasPrefix(line, "data: ") || !strings.Contains(line, `"role":"assistant"`) {
		t.Fatalf("first line after the thaw %q, want the role chunk", line)
	}
	if got := scrapeMetrics(t, s.url); got.PromptTokens <= before.PromptTokens {
		t.Errorf("prompt tokens %v after the thaw, want more than %v", got.PromptTokens, before.PromptTokens)
	}
	if r, body := post(t, s.url+"/admin/freeze?duration=-1s", nil); r.StatusCode != 400 || !bytes.Contains(body, []byte("duration")) {
		t.Errorf("negative duration: %d %s, want 400", r.StatusCode, body)
	}
	if n := testutil.CollectAndCount(s.reg, "vllm:prompt_tokens_total"); n == 0 {
		t.Error("no vllm:prompt_tokens_total series")
	}
}
