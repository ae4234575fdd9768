package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"kvrouter/internal/enginesim"
)

// TestE2EMultiTurnStaysOnReplica: a 3-turn chat, repeated, goes to the
// replica that served it; 20 concurrent multi-turn chats sharing one system
// prompt keep each conversation on its replica. Router and engines tokenize
// with the real Qwen3 tokenizer, and the engines' KV events feed the index.
func TestE2EMultiTurnStaysOnReplica(t *testing.T) {
	e2eLeakCheck(t)
	bin := e2eBuild(t)
	a, b := startE2ESimProcess(t, bin), startE2ESimProcess(t, bin)
	// The router's throughput model matches the engines (the h100 profile
	// prefills 20,000 tokens/s): load terms then weigh what they cost.
	r := startE2ERouter(t, "tokenizer: "+e2eQwen3Dir+"\nrouting: {prefill_rate: 20000}\n", a, b)
	system := strings.Repeat("You are a meticulous assistant for a logistics company. ", 30)

	// A long first turn (a document, about 3,000 tokens) and short
	// follow-ups: each conversation's own history outweighs the load
	// differences between replicas, so affinity must win.
	turns := func(conv int) [][]string {
		u1 := fmt.Sprintf("Conversation %d: summarise this manifest. %s", conv, strings.Repeat(fmt.Sprintf("line %d-%d; ", conv, conv*7919), 500))
		u2 := fmt.Sprintf("And parcel %d, conversation %d?", conv*31, conv)
		u3 := "Thanks. Summarise both."
		return [][]string{{system, u1}, {system, u1, "It is in Lyon.", u2}, {system, u1, "It is in Lyon.", u2, "It is in Oslo.", u3}}
	}
	var first string
	for rep := range 2 {
		for i, msgs := range turns(0) {
			resp, body := r.post("/v1/chat/completions", e2eChat(msgs...))
			if resp.StatusCode != 200 {
				t.Fatalf("turn %d: %d %s", i, resp.StatusCode, body)
			}
			replica := resp.Header.Get("X-Kvrouter-Replica")
			if first == "" {
				first = replica
			} else if replica != first {
				t.Fatalf("round %d turn %d went to %s, the conversation is on %s", rep, i, replica, first)
			}
			if i > 0 && resp.Header.Get("X-Kvrouter-Cached-Tokens") == "0" {
				t.Errorf("round %d turn %d: predicted no cached tokens", rep, i)
			}
		}
	}

	var mu sync.Mutex
	home := map[int]string{}
	moved := map[int]string{}
	for turn := range 3 { // all 20 conversations' turn, concurrently
		var wg sync.WaitGroup
		for c := 1; c <= 20; c++ {
			wg.Go(func() {
				resp, body := r.post("/v1/chat/completions", e2eChat(turns(c)[turn]...))
				if resp.StatusCode != 200 {
					t.Errorf("conversation %d turn %d: %d %s", c, turn, resp.StatusCode, body)
					return
				}
				replica := resp.Header.Get("X-Kvrouter-Replica")
				mu.Lock()
				defer mu.Unlock()
				if turn == 0 {
					home[c] = replica
				} else if replica != home[c] {
					moved[c] = fmt.Sprintf("turn %d on %s (cached %s), home %s", turn, replica, resp.Header.Get("X-Kvrouter-Cached-Tokens"), home[c])
				}
			})
		}
		wg.Wait()
	}
	// Under a burst of 20 concurrent requests the kv policy may still move
	// a follow-up when the engines' scraped waiting queues differ enough
	// (design: affinity yields once queueing costs more than recomputing);
	// in runs on a loaded 2-core machine 0 to 3 of 40 moved.
	if len(moved) > 4 {
		t.Errorf("%d of 40 follow-up turns left their conversation's replica: %v", len(moved), moved)
	} else if len(moved) > 0 {
		t.Logf("follow-ups that moved: %v", moved)
	}
	e2eEventually(t, 10*time.Second, "in-flight back to 0", func() bool {
		return e2eMetric(t, r.url, "kvrouter_proxy_in_flight_requests") == 0 &&
			e2eMetric(t, r.url, "kvrouter_routing_in_flight_requests") == 0
	})
	if n := e2eMetric(t, r.url, "kvrouter_kvindex_entries"); n == 0 {
		t.Error("the index holds no entries: KV events did not arrive")
	}
}

// TestE2EClientCancel: a client that leaves after 1 s closes the engine's
// request within about a second; in-flight gauges return to 0.
func TestE2EClientCancel(t *testing.T) {
	e2eLeakCheck(t)
	a := startE2ESim(t, e2eProfile(enginesim.ProfileH100))
	r := startE2ERouter(t, "tokenizer: none\n", a)
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	body := `{"model":"m","stream":true,"max_tokens":30000,"messages":[{"role":"user","content":"write forever"}]}`
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.url+"/v1/chat/completions", strings.NewReader(body))
	resp, err := r.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatalf("first bytes: %v", err)
	}
	e2eEventually(t, 10*time.Second, "engine running the request", func() bool {
		return e2eMetric(t, a.url, "vllm:num_requests_running") == 1
	})
	<-ctx.Done() // the client gives up after 1 s
	resp.Body.Close()
	left := time.Now()
	e2eEventually(t, 1500*time.Millisecond, "engine request aborted", func() bool {
		return e2eMetric(t, a.url, "vllm:num_requests_running") == 0
	})
	t.Logf("engine aborted %v after the client left", time.Since(left).Round(time.Millisecond))
	e2eEventually(t, 10*time.Second, "router in-flight back to 0", func() bool {
		return e2eMetric(t, r.url, "kvrouter_proxy_in_flight_requests") == 0 &&
			e2eMetric(t, r.url, "kvrouter_routing_in_flight_requests") == 0
	})
	if n := e2eMetric(t, r.url, "kvrouter_proxy_requests_total", `outcome="client_closed"`); n != 1 {
		t.Errorf("client_closed outcomes %v, want 1", n)
	}
}

// TestE2EBadRequestsNeverEject: 20 requests the engine answers 400 (prompt
// longer than max_model_len), then a valid one succeeds; no engine ejected.
func TestE2EBadRequestsNeverEject(t *testing.T) {
	e2eLeakCheck(t)
	a, b := startE2ESim(t, e2eMaxModelLen(256)), startE2ESim(t, e2eMaxModelLen(256))
	r := startE2ERouter(t, "tokenizer: none\n", a, b)
	long := e2eChat("s", strings.Repeat("x", 2000))
	for i := range 20 {
		resp, body := r.post("/v1/chat/completions", long)
		if resp.StatusCode != 400 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	resp, body := r.post("/v1/chat/completions", e2eChat("s", "hi"))
	if resp.StatusCode != 200 {
		t.Fatalf("valid request: %d %s", resp.StatusCode, body)
	}
	if up := e2eMetric(t, r.url, "kvrouter_fleet_endpoint_up"); up != 2 {
		t.Errorf("endpoints up %v, want 2", up)
	}
	if n := e2eMetric(t, r.url, "kvrouter_proxy_retries_total"); n != 0 {
		t.Errorf("retries %v, want 0", n)
	}
}

// TestE2EModelsOneEngineDown: /v1/models answers 200 with one of two
// engines stopped.
func TestE2EModelsOneEngineDown(t *testing.T) {
	e2eLeakCheck(t)
	a, b := startE2ESim(t), startE2ESim(t)
	r := startE2ERouter(t, "tokenizer: none\n", a, b)
	b.stop()
	resp, err := r.client.Get(r.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Data []struct{ ID string } `json:"data"`
	}
	err = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if resp.StatusCode != 200 || err != nil || len(list.Data) != 1 || list.Data[0].ID != "m" {
		t.Fatalf("%d %v %+v", resp.StatusCode, err, list)
	}
}

// TestE2EBodiesAndValidation: a 2 MB chat is routed, 40 MB gets 413, and
// malformed requests get 400, never 500.
func TestE2EBodiesAndValidation(t *testing.T) {
	e2eLeakCheck(t)
	a := startE2ESim(t)
	r := startE2ERouter(t, "tokenizer: none\n", a)
	resp, body := r.post("/v1/chat/completions", e2eChat("s", strings.Repeat("abcd ", 2<<20/5)))
	// Routed: the engine answered (200, or its own 400 for a prompt
	// longer than max_model_len), through replica e0.
	if resp.StatusCode >= 500 || resp.StatusCode == 413 || resp.Header.Get("X-Kvrouter-Replica") != "e0" {
		t.Errorf("2 MB chat: %d %.200s", resp.StatusCode, body)
	}
	resp, body = r.post("/v1/chat/completions", e2eChat("s", strings.Repeat("abcd ", 40<<20/5)))
	if resp.StatusCode != 413 {
		t.Errorf("40 MB chat: %d %.200s", resp.StatusCode, body)
	}
	for _, c := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"m","messages":[]}`},
		{"/v1/completions", `{"model":"m","prompt":123}`},
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}]}]}`},
		{"/v1/chat/completions", `{"model":"m","messages":`},
	} {
		resp, body := r.post(c.path, c.body)
		if resp.StatusCode >= 500 {
			t.Errorf("%s %s: %d %s", c.path, c.body, resp.StatusCode, body)
		}
		if resp.StatusCode != 200 && resp.StatusCode != 400 {
			t.Errorf("%s %s: %d, want 400 or routed", c.path, c.body, resp.StatusCode)
		}
	}
}

// TestE2EStreamDiesNoDuplicate: an engine that breaks a stream after 3
// tokens ends the client's stream with an error event, no [DONE], and the
// request is not replayed elsewhere.
func TestE2EStreamDiesNoDuplicate(t *testing.T) {
	e2eLeakCheck(t)
	f := enginesim.Faults{DieRate: 1, DieAfterTokens: 3}
	a, b := startE2ESim(t, e2eFaults(f)), startE2ESim(t, e2eFaults(f))
	r := startE2ERouter(t, "tokenizer: none\n", a, b)
	resp, body := r.post("/v1/chat/completions", `{"model":"m","stream":true,"max_tokens":20,"messages":[{"role":"user","content":"count"}]}`)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	// Strict: exactly 3 content events from one engine response (one id,
	// one role chunk: a replay elsewhere would repeat both), then exactly
	// one error event, last, and no [DONE].
	var tokens, errs, roles int
	ids := map[string]bool{}
	for l := range strings.Lines(body) {
		data, ok := strings.CutPrefix(strings.TrimSpace(l), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			t.Error("[DONE] after a broken stream")
			continue
		}
		var ev struct {
			ID      string                    `json:"id"`
			Error   *struct{ Message string } `json:"error"`
			Choices []struct {
				Delta struct{ Role, Content string } `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("event %q: %v", data, err)
		}
		if ev.Error != nil {
			errs++
			if strings.Contains(ev.Error.Message, "127.0.0.1") {
				t.Errorf("error event shows the engine's address: %q", ev.Error.Message)
			}
			continue
		}
		if errs > 0 {
			t.Errorf("event after the error event: %s", data)
		}
		ids[ev.ID] = true
		if len(ev.Choices) > 0 && ev.Choices[0].Delta.Role != "" {
			roles++
		}
		if len(ev.Choices) > 0 && ev.Choices[0].Delta.Content != "" {
			tokens++
		}
	}
	if tokens != 3 || errs != 1 || roles != 1 || len(ids) != 1 {
		t.Errorf("%d tokens, %d error events, %d role chunks, %d response ids; want 3, 1, 1, 1:\n%s", tokens, errs, roles, len(ids), body)
	}
	if n := e2eMetric(t, r.url, "kvrouter_proxy_retries_total"); n != 0 {
		t.Errorf("retried after the first byte: %v", n)
	}
	if n := e2eMetric(t, r.url, "kvrouter_routing_decisions_total"); n != 1 {
		t.Errorf("%v routing decisions, want 1", n)
	}
}

// TestE2EDeadEngineStopsReceivingTraffic: round_robin over two engines; one
// dies; after its first connection error it gets nothing more.
func TestE2EDeadEngineStopsReceivingTraffic(t *testing.T) {
	e2eLeakCheck(t)
	a, b := startE2ESim(t), startE2ESim(t)
	r := startE2ERouter(t, "tokenizer: none\npolicy: round_robin\n", a, b)
	b.stop()
	for i := range 20 {
		resp, body := r.post("/v1/chat/completions", e2eChat("s", fmt.Sprint("hi ", i)))
		if resp.StatusCode != 200 || resp.Header.Get("X-Kvrouter-Replica") != "e0" {
			t.Fatalf("request %d: %d on %q %s", i, resp.StatusCode, resp.Header.Get("X-Kvrouter-Replica"), body)
		}
	}
	if n := e2eMetric(t, r.url, "kvrouter_routing_decisions_total", `replica="e1"`); n > 1 {
		t.Errorf("dead engine chosen %v times, want at most once", n)
	}
	if n := e2eMetric(t, r.url, "kvrouter_fleet_ejections_total", `endpoint="e1"`); n != 1 {
		t.Errorf("ejections of e1: %v, want 1", n)
	}
}

// TestE2ESessionSticks: 100 requests with one x-session-id stay on one
// replica.
func TestE2ESessionSticks(t *testing.T) {
	e2eLeakCheck(t)
	a, b, c := startE2ESim(t), startE2ESim(t), startE2ESim(t)
	r := startE2ERouter(t, "tokenizer: none\npolicy: session\n", a, b, c)
	seen := map[string]int{}
	for i := range 100 {
		resp, body := r.post("/v1/chat/completions", e2eChat("s", fmt.Sprint("question ", i)), "X-Session-Id", "user-42")
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		seen[resp.Header.Get("X-Kvrouter-Replica")]++
	}
	if len(seen) != 1 {
		t.Errorf("one session spread over %v", seen)
	}
}

// TestE2EShadow: policy shadow serves round_robin and exports what kv would
// have chosen.
func TestE2EShadow(t *testing.T) {
	e2eLeakCheck(t)
	a, b := startE2ESim(t), startE2ESim(t)
	r := startE2ERouter(t, "tokenizer: none\npolicy: shadow\n", a, b)
	seen := map[string]int{}
	for range 10 {
		resp, body := r.post("/v1/completions", `{"model":"m","max_tokens":2,"prompt":[`+strings.Repeat("7,", 200)+`7]}`)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		seen[resp.Header.Get("X-Kvrouter-Replica")]++
	}
	if seen["e0"] != 5 || seen["e1"] != 5 {
		t.Errorf("round_robin should serve 5/5: %v", seen)
	}
	agree := e2eMetric(t, r.url, "kvrouter_proxy_shadow_decisions_total", `agree="true"`)
	disagree := e2eMetric(t, r.url, "kvrouter_proxy_shadow_decisions_total", `agree="false"`)
	if agree+disagree != 10 || disagree == 0 {
		t.Errorf("shadow decisions agree=%v disagree=%v", agree, disagree)
	}
	if n := e2eMetric(t, r.url, "kvrouter_proxy_shadow_cached_tokens_sum"); n == 0 {
		t.Error("kv would have found nothing cached for a repeated prompt")
	}
}

// TestE2EOpenAINodeClient runs the official openai npm client (streaming
// and not) through kvrouter to engine-sims. It needs node and
// tools/openai-e2e/node_modules (npm ci --prefix tools/openai-e2e).
func TestE2EOpenAINodeClient(t *testing.T) {
	if testing.Short() {
		t.Skip("needs node and the openai npm package")
	}
	dir := filepath.Join("..", "..", "tools", "openai-e2e")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "openai", "package.json")); err != nil {
		t.Fatalf("the openai npm client is not installed: run `npm ci --prefix tools/openai-e2e` (%v)", err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node not found: %v", err)
	}
	e2eLeakCheck(t)
	a, b := startE2ESim(t), startE2ESim(t)
	r := startE2ERouter(t, "tokenizer: none\n", a, b)
	cmd := exec.CommandContext(t.Context(), node, "chat.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "KVROUTER_URL="+r.url, "MODEL=m")
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("node chat.mjs: %v\n%s%s", err, out, stderr)
	}
	var res struct {
		Nonstream struct {
			Content, Finish, Replica, Cached string
			Usage                            struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
			RequestID string `json:"request_id"`
		}
		Stream struct {
			Content, Finish string
			Chunks          int
			Usage           *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	ns, st := res.Nonstream, res.Stream
	if ns.Content == "" || ns.Finish != "length" || ns.Replica == "" || ns.Cached == "" || ns.RequestID == "" || ns.Usage.CompletionTokens != 8 {
		t.Errorf("non-streaming: %+v", ns)
	}
	if st.Content == "" || st.Finish != "length" || st.Chunks < 8 || st.Usage == nil || st.Usage.CompletionTokens != 8 {
		t.Errorf("streaming: %+v usage %+v", st, st.Usage)
	}
}
