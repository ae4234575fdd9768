package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"kvrouter/internal/config"
	"kvrouter/internal/fleet"
	"kvrouter/internal/group"
	"kvrouter/internal/testwait"
)

func TestNonStreamingRelay(t *testing.T) {
	rg := newRig(t, 2)
	resp := rg.post("/v1/chat/completions", chatBody, "X-Request-Id", "req-42", "Authorization", "Bearer client-secret", "Connection", "X-Drop", "X-Drop", "1")
	body := readAll(t, resp)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var out struct {
		Choices []struct {
			Message struct{ Content string }
		}
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil || out.Choices[0].Message.Content != "xxx" {
		t.Fatalf("body %s (%v)", body, err)
	}
	for k, want := range map[string]string{
		"X-Kvrouter-Replica": "e0", "X-Kvrouter-Cached-Tokens": "32", "X-Request-Id": "req-42", "X-Engine": "e0", "X-Secret": "",
	} {
		if got := resp.Header.Get(k); got != want {
			t.Errorf("response header %s = %q, want %q", k, got, want)
		}
	}
	h := rg.engines[0].lastHeader()
	if h.Get("X-Request-Id") != "req-42" || h.Get("Authorization") != "" || h.Get("X-Drop") != "" {
		t.Errorf("engine saw id %q auth %q x-drop %q", h.Get("X-Request-Id"), h.Get("Authorization"), h.Get("X-Drop"))
	}
	var fwd map[string]json.RawMessage
	if err := json.Unmarshal(rg.engines[0].lastBody(), &fwd); err != nil {
		t.Fatal(err)
	}
	if string(fwd["vllm_xargs"]) != `{"kv_cache_report_mode":"full"}` {
		t.Errorf("forwarded vllm_xargs = %s", fwd["vllm_xargs"])
	}
	if rg.outcome("e0", outcomeOK) != 1 {
		t.Error("requests_total{outcome=ok} != 1")
	}
}

func TestRequestIDGenerated(t *testing.T) {
	rg := newRig(t, 1)
	resp := rg.post("/v1/completions", `{"model":"m","prompt":[1,2,3]}`)
	readAll(t, resp)
	id := resp.Header.Get("X-Request-Id")
	if len(id) != 32 || rg.engines[0].lastHeader().Get("X-Request-Id") != id {
		t.Errorf("generated id %q, engine saw %q", id, rg.engines[0].lastHeader().Get("X-Request-Id"))
	}
	rg.router.mu.Lock()
	toks := rg.router.inputs[0].Tokens
	rg.router.mu.Unlock()
	if len(toks) != 3 || toks[2] != 3 {
		t.Errorf("router got tokens %v, want the prompt's ids", toks)
	}
}

func TestHitReportMerge(t *testing.T) {
	tests := []struct {
		name, body string
		disable    bool
		want       string // forwarded vllm_xargs
	}{
		{"absent", `{"model":"m","prompt":"a"}`, false, `{"kv_cache_report_mode":"full"}`},
		{"merged", `{"model":"m","prompt":"a","vllm_xargs":{"x":1}}`, false, `{"kv_cache_report_mode":"full","x":1}`},
		{"client choice kept", `{"model":"m","prompt":"a","vllm_xargs":{"kv_cache_report_mode":"off"}}`, false, `{"kv_cache_report_mode":"off"}`},
		{"disabled", `{"model":"m","prompt":"a"}`, true, ``},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rg := newRig(t, 1, func(c *config.Config, _ *fleet.Config) { c.Models[0].DisableHitReport = tt.disable })
			readAll(t, rg.post("/v1/completions", tt.body))
			var fwd map[string]json.RawMessage
			if err := json.Unmarshal(rg.engines[0].lastBody(), &fwd); err != nil {
				t.Fatal(err)
			}
			if got := string(fwd["vllm_xargs"]); got != tt.want {
				t.Errorf("vllm_xargs = %s, want %s", got, tt.want)
			}
		})
	}
}

// TestStreamNotBuffered proves events reach the client one at a time: the
// engine sends the next event only after the client has read the previous.
func TestStreamNotBuffered(t *testing.T) {
	rg := newRig(t, 1)
	step := make(chan struct{})
	rg.engines[0].set(func(e *engine) { e.step = step; e.chunks = 3 })
	resp := rg.post("/v1/chat/completions", chatStream)
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("content-type %q", ct)
	}
	buf := make([]byte, 4096)
	for i := range 2 {
		step <- struct{}{}
		n, err := resp.Body.Read(buf)
		if err != nil {
			t.Fatalf("event %d: %v (%q)", i, err, buf[:n])
		}
		if got := string(buf[:n]); !strings.Contains(got, `"t`+string(rune('0'+i))+`"`) || !strings.HasSuffix(got, "\n\n") {
			t.Fatalf("event %d: %q", i, got)
		}
	}
	step <- struct{}{}
	rest := readAll(t, resp)
	if !strings.HasPrefix(rest, "data: {") || !strings.Contains(rest, `"t2"`) || !strings.HasSuffix(rest, "\n\ndata: [DONE]\n\n") {
		t.Errorf("rest %q", rest)
	}
}

func TestBodyLimit(t *testing.T) {
	rg := newRig(t, 1)
	msg := strings.Repeat("a", 2<<20)
	resp := rg.post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"`+msg+`"}]}`)
	if body := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("2 MB body: %d %s", resp.StatusCode, body[:min(len(body), 200)])
	}
	if n := len(rg.engines[0].lastBody()); n < 2<<20 {
		t.Errorf("engine got %d bytes", n)
	}
	big := strings.Repeat("a", 40<<20)
	resp = rg.post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"`+big+`"}]}`)
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(body, `"code":413`) {
		t.Fatalf("40 MB body: %d %s", resp.StatusCode, body)
	}
	if n := rg.engines[0].requests.Load(); n != 1 {
		t.Errorf("engine got %d requests", n)
	}
}

func TestRetries(t *testing.T) {
	tests := []struct {
		name        string
		first       int // status of e0 (-1: connection refused)
		retries     int // config value
		wantStatus  int // to the client
		wantReplica string
		wantE1      int32 // requests e1 received
		wantE0Up    bool
	}{
		{"503 retried elsewhere", 503, 0, 200, "e1", 1, true},
		{"429 retried elsewhere", 429, 0, 200, "e1", 1, true},
		{"502 retried elsewhere", 502, 0, 200, "e1", 1, true},
		{"400 relayed, no retry", 400, 0, 400, "e0", 0, true},
		{"404 relayed, no retry", 404, 0, 404, "e0", 0, true},
		{"500 relayed, no retry", 500, 0, 500, "e0", 0, true},
		{"connection refused retried and ejected", -1, 0, 200, "e1", 1, false},
		{"no retries: 503 relayed", 503, -1, 503, "e0", 0, true},
		{"no retries: connection refused is 502", -1, -1, 502, "e0", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rg := newRig(t, 2, func(c *config.Config, _ *fleet.Config) { c.Models[0].Retries = tt.retries })
			if tt.first < 0 {
				rg.engines[0].srv.Close()
			} else {
				rg.engines[0].set(func(e *engine) { e.status = tt.first })
			}
			resp := rg.post("/v1/chat/completions", chatBody)
			body := readAll(t, resp)
			if resp.StatusCode != tt.wantStatus {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.wantStatus, body)
			}
			if got := resp.Header.Get("X-Kvrouter-Replica"); resp.StatusCode != 502 && got != tt.wantReplica {
				t.Errorf("replica %q, want %q", got, tt.wantReplica)
			}
			if n := rg.engines[1].requests.Load(); n != tt.wantE1 {
				t.Errorf("e1 got %d requests, want %d", n, tt.wantE1)
			}
			if up := rg.fleet.Endpoint("e0").Up(); up != tt.wantE0Up {
				t.Errorf("e0 up = %v, want %v", up, tt.wantE0Up)
			}
		})
	}
}

// TestFourXXNeverEjects: 20 requests answered 400 by the engine, then a
// valid request succeeds on the same, only, engine.
func TestFourXXNeverEjects(t *testing.T) {
	rg := newRig(t, 1)
	rg.engines[0].set(func(e *engine) { e.status = 400 })
	for range 20 {
		resp := rg.post("/v1/chat/completions", chatBody)
		if readAll(t, resp); resp.StatusCode != 400 {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	rg.engines[0].set(func(e *engine) { e.status = 0 })
	resp := rg.post("/v1/chat/completions", chatBody)
	if body := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("valid request after 20 400s: %d %s", resp.StatusCode, body)
	}
	if got := rg.outcome("e0", outcomeEngineError); got != 20 {
		t.Errorf("engine_error outcomes %v", got)
	}
}

// TestMidStreamFailure: an engine that breaks after 3 events ends the
// client's stream with an error event; nothing is repeated, no retry.
func TestMidStreamFailure(t *testing.T) {
	rg := newRig(t, 2)
	rg.engines[0].set(func(e *engine) { e.chunks = 10; e.failAfter = 3 })
	resp := rg.post("/v1/chat/completions", chatStream)
	body := readAll(t, resp)
	lines := dataLines(body)
	if len(lines) != 4 {
		t.Fatalf("want 3 events and an error, got %q", lines)
	}
	for i := range 3 {
		if !strings.Contains(lines[i], `"t`+string(rune('0'+i))+`"`) {
			t.Errorf("event %d = %s", i, lines[i])
		}
	}
	var e struct {
		Error struct{ Message string } `json:"error"`
	}
	if err := json.Unmarshal([]byte(strings.TrimPrefix(lines[3], "data: ")), &e); err != nil || e.Error.Message == "" {
		t.Errorf("last event is not an error: %s", lines[3])
	}
	if rg.engines[1].requests.Load() != 0 || rg.engines[0].requests.Load() != 1 {
		t.Errorf("retried after the first byte: e0 %d e1 %d", rg.engines[0].requests.Load(), rg.engines[1].requests.Load())
	}
	if rg.outcome("e0", outcomeUpstream) != 1 {
		t.Error("outcome upstream_error not counted")
	}
}

// TestStreamWithoutDone: an engine that closes its stream cleanly after k
// events but without data: [DONE] (vLLM stopped by SIGTERM) is a failure
// after the first byte: exactly the k events, one error event, no [DONE],
// outcome upstream_error, the replica reported, nothing left in flight.
func TestStreamWithoutDone(t *testing.T) {
	rg := newRig(t, 2)
	const k = 4
	rg.engines[0].set(func(e *engine) { e.chunks = k; e.noDone = true })
	resp := rg.post("/v1/chat/completions", chatStream)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	body := readAll(t, resp)
	lines := dataLines(body)
	if len(lines) != k+1 {
		t.Fatalf("want %d events and an error, got %q", k, lines)
	}
	for i := range k {
		if !strings.Contains(lines[i], `"t`+string(rune('0'+i))+`"`) {
			t.Errorf("event %d = %s", i, lines[i])
		}
	}
	var e struct {
		Error struct {
			Message string
			Code    int
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(strings.TrimPrefix(lines[k], "data: ")), &e); err != nil || e.Error.Message == "" || e.Error.Code != http.StatusBadGateway {
		t.Errorf("last event is not an error: %s", lines[k])
	}
	if strings.Contains(body, "[DONE]") {
		t.Errorf("[DONE] relayed after a truncated stream: %q", body)
	}
	if rg.engines[1].requests.Load() != 0 {
		t.Error("retried after the first byte")
	}
	if rg.outcome("e0", outcomeUpstream) != 1 || rg.outcome("e0", outcomeOK) != 0 {
		t.Errorf("outcomes: upstream_error %v ok %v", rg.outcome("e0", outcomeUpstream), rg.outcome("e0", outcomeOK))
	}
	// A whole stream still counts ok (on e1 if e0 was ejected).
	rg.engines[0].set(func(e *engine) { e.noDone = false })
	if body := readAll(t, rg.post("/v1/chat/completions", chatStream)); !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Errorf("whole stream: %q", body)
	}
	if rg.outcome("e0", outcomeOK)+rg.outcome("e1", outcomeOK) != 1 {
		t.Error("whole stream not counted ok")
	}
}

func TestEndsWithDone(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want bool
	}{
		{"data: [DONE]\n\n", true},
		{"data: {}\n\ndata: [DONE]\n\n", true},
		{"data:[DONE]\r\n\r\n", true},
		{"data: [DONE]", true},
		{"data: {}\n\n", false},
		{"data: {\"x\":\"[DONE]\"}\n\n", false},
		{"xdata: [DONE]\n\n", false},
		{"", false},
	} {
		if got := endsWithDone([]byte(tc.in)); got != tc.want {
			t.Errorf("endsWithDone(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// TestMidBodyFailureNonStreaming: a non-event body cut short is cut short
// for the client too (connection aborted), never completed.
func TestMidBodyFailureNonStreaming(t *testing.T) {
	rg := newRig(t, 1)
	rg.engines[0].srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "1000")
		w.Write([]byte(`{"id":"x","choices":[`))
		http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler)
	})
	req, _ := http.NewRequest(http.MethodPost, rg.front.URL+"/v1/chat/completions", strings.NewReader(chatBody))
	resp, err := rg.client.Do(req)
	if err == nil {
		defer resp.Body.Close()
		_, err = readAllErr(resp)
	}
	if err == nil {
		t.Fatal("client read a complete body from a broken engine response")
	}
	if rg.outcome("e0", outcomeUpstream) != 1 {
		t.Error("outcome upstream_error not counted")
	}
}

func readAllErr(resp *http.Response) ([]byte, error) {
	var out []byte
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil {
			if err.Error() == "EOF" {
				return out, nil
			}
			return out, err
		}
	}
}

func TestClientCancel(t *testing.T) {
	for _, stream := range []bool{false, true} {
		for _, when := range []string{"before first byte", "mid-stream"} {
			if !stream && when == "mid-stream" {
				continue
			}
			t.Run(map[bool]string{false: "non-streaming", true: "streaming"}[stream]+"/"+when, func(t *testing.T) {
				rg := newRig(t, 1)
				step := make(chan struct{}, 1)
				rg.engines[0].set(func(e *engine) {
					if when == "before first byte" {
						e.block = true
					} else {
						e.step, e.chunks = step, 5
					}
				})
				ctx, cancel := context.WithCancel(t.Context())
				body := chatBody
				if stream {
					body = chatStream
				}
				done := make(chan struct{})
				go func() {
					defer close(done)
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, rg.front.URL+"/v1/chat/completions", strings.NewReader(body))
					resp, err := rg.client.Do(req)
					if err != nil {
						return
					}
					defer resp.Body.Close()
					if when == "mid-stream" {
						step <- struct{}{}
						buf := make([]byte, 1024)
						resp.Body.Read(buf)
						cancel()
					}
					resp.Body.Read(make([]byte, 1024))
				}()
				<-rg.engines[0].started
				if when == "before first byte" {
					cancel()
				}
				select {
				case <-rg.engines[0].canceled:
				case <-time.After(10 * time.Second):
					t.Fatal("engine request not cancelled within 10 s of the client leaving")
				}
				<-done
				cancel()
				rg.checkDrained()
				deadline := time.Now().Add(10 * time.Second)
				for rg.outcome("e0", outcomeClientClosed) != 1 {
					if time.Now().After(deadline) {
						t.Fatal("client_closed outcome not counted")
					}
					time.Sleep(5 * time.Millisecond)
				}
			})
		}
	}
}

// TestHalfClosedClientGetsNoAnswer: a client that shuts its side for
// writing after the request makes net/http cancel the request; the router
// then closes the connection without an answer, instead of the empty 200
// net/http writes for a handler that wrote nothing.
func TestHalfClosedClientGetsNoAnswer(t *testing.T) {
	rg := newRig(t, 1)
	rg.engines[0].set(func(e *engine) { e.block = true })
	conn, err := net.Dial("tcp", strings.TrimPrefix(rg.front.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(chatBody), chatBody)
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	// Whether the engine saw the request depends on when net/http read
	// the end of the connection (during the body or after it); either
	// way the request ends as client_closed.
	testwait.For(t, "client_closed outcome counted", func() bool {
		return rg.outcome("e0", outcomeClientClosed)+testutil.ToFloat64(rg.srv.m.requests.WithLabelValues(modelUnknown, "", outcomeClientClosed)) == 1
	})
	_ = conn.SetReadDeadline(time.Now().Add(testwait.Default))
	got, err := io.ReadAll(conn)
	if len(got) != 0 {
		t.Fatalf("half-closed client got %q, want the connection closed without an answer", got)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("connection still open %v after the request was cancelled", testwait.Default)
	}
	rg.checkDrained()
}

func TestTimeouts(t *testing.T) {
	t.Run("first byte", func(t *testing.T) {
		rg := newRig(t, 1, func(c *config.Config, _ *fleet.Config) { c.Models[0].Timeouts.FirstByte = 100 * time.Millisecond })
		rg.engines[0].set(func(e *engine) { e.block = true })
		resp := rg.post("/v1/chat/completions", chatBody)
		body := readAll(t, resp)
		if resp.StatusCode != http.StatusGatewayTimeout {
			t.Fatalf("status %d %s", resp.StatusCode, body)
		}
		<-rg.engines[0].canceled
		if !rg.fleet.Endpoint("e0").Up() {
			t.Error("a slow engine was ejected")
		}
	})
	t.Run("idle", func(t *testing.T) {
		rg := newRig(t, 1, func(c *config.Config, _ *fleet.Config) { c.Models[0].Timeouts.Idle = 100 * time.Millisecond })
		step := make(chan struct{}, 1)
		step <- struct{}{}
		rg.engines[0].set(func(e *engine) { e.step, e.chunks = step, 3 })
		resp := rg.post("/v1/chat/completions", chatStream)
		lines := dataLines(readAll(t, resp))
		if len(lines) != 2 || !strings.Contains(lines[1], "idle timeout") {
			t.Fatalf("events %q", lines)
		}
		<-rg.engines[0].canceled
	})
}

func TestNoHealthyReplica(t *testing.T) {
	rg := newRig(t, 2)
	for _, e := range rg.engines {
		rg.fleet.Report(rg.fleet.Endpoint(e.name), fleet.OutcomeConnError)
	}
	resp := rg.post("/v1/chat/completions", chatBody)
	body := readAll(t, resp)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" || !strings.Contains(body, `"code":503`) {
		t.Fatalf("status %d retry-after %q body %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
}

// TestDeadStaticEngine: an engine that dies gets no traffic after the first
// connection error (for its ejection's backoff: a minute here, so that a
// slow machine's 20 requests all fall inside it).
func TestDeadStaticEngine(t *testing.T) {
	rg := newRig(t, 2, func(_ *config.Config, f *fleet.Config) { f.BackoffBase, f.BackoffMax = time.Minute, time.Minute })
	var rr int
	rg.router.pick = func(in *group.RouteInput) string { rr++; return in.Candidates[rr%len(in.Candidates)] }
	rg.engines[1].srv.Close()
	for i := range 20 {
		resp := rg.post("/v1/chat/completions", chatBody)
		if body := readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	if got := rg.outcome("e0", outcomeOK); got != 20 {
		t.Errorf("e0 served %v of 20", got)
	}
	rg.router.mu.Lock()
	defer rg.router.mu.Unlock()
	attempts := 0
	for _, in := range rg.router.inputs {
		for _, c := range in.Candidates {
			if c == "e1" {
				attempts++
			}
		}
	}
	if attempts != 1 {
		t.Errorf("e1 was a candidate %d times, want once (until its first connection error)", attempts)
	}
}

func TestModelsOneEngineDown(t *testing.T) {
	rg := newRig(t, 2)
	rg.engines[1].srv.Close()
	req, _ := http.NewRequest(http.MethodGet, rg.front.URL+"/v1/models", nil)
	resp, err := rg.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	if resp.StatusCode != 200 || !strings.Contains(body, `"id":"m"`) || !strings.Contains(body, `"owned_by":"e0"`) {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
}

func TestRouteExplain(t *testing.T) {
	rg := newRig(t, 2)
	for _, c := range []struct{ path, body string }{
		{"/v1/route", chatBody},
		{"/v1/route", `{"model":"m","prompt":[1,2,3,4]}`},
		{"/v1/chat/completions", chatBody},
	} {
		resp := rg.post(c.path, c.body, "X-Kvrouter-Route-Only", "1")
		body := readAll(t, resp)
		var out struct {
			Replica      string `json:"replica"`
			URL          string `json:"url"`
			CachedTokens int    `json:"cached_tokens"`
			Explain      struct {
				Candidates []string `json:"candidates"`
			} `json:"explain"`
		}
		if err := json.Unmarshal([]byte(body), &out); err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", c.path, resp.StatusCode, body)
		}
		if out.Replica != "e0" || out.URL != rg.engines[0].srv.URL || out.CachedTokens != 32 || len(out.Explain.Candidates) != 2 {
			t.Errorf("%s: %+v", c.path, out)
		}
	}
	if n := rg.engines[0].requests.Load(); n != 0 {
		t.Errorf("explain forwarded %d requests", n)
	}
	rg.router.mu.Lock()
	defer rg.router.mu.Unlock()
	for _, in := range rg.router.inputs {
		if !in.DryRun {
			t.Error("explain routed without DryRun")
		}
	}
}

func TestSessionHeader(t *testing.T) {
	rg := newRig(t, 1, func(c *config.Config, _ *fleet.Config) {
		c.Models[0].SessionHeaders = []string{"x-user", "x-session-id"}
	})
	readAll(t, rg.post("/v1/chat/completions", chatBody, "X-Session-Id", "s1"))
	readAll(t, rg.post("/v1/chat/completions", chatBody, "X-User", "u1", "X-Session-Id", "s1"))
	rg.router.mu.Lock()
	defer rg.router.mu.Unlock()
	if rg.router.inputs[0].Session != "s1" || rg.router.inputs[1].Session != "u1" {
		t.Errorf("sessions %q %q", rg.router.inputs[0].Session, rg.router.inputs[1].Session)
	}
}
