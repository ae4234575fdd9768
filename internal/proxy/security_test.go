package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	rtmetrics "runtime/metrics"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"kvrouter/internal/config"
	"kvrouter/internal/fleet"
	"kvrouter/internal/request"
)

// openAIError decodes an error answer, failing unless it has OpenAI's
// shape with the given status and type.
func openAIError(t *testing.T, what string, resp *http.Response, body string, status int, typ string) errorDetail {
	t.Helper()
	var e errorBody
	if err := json.Unmarshal([]byte(body), &e); err != nil || resp.StatusCode != status || e.Error.Type != typ || e.Error.Code != status || e.Error.Message == "" {
		t.Fatalf("%s: %d %q, want %d with an OpenAI error of type %s", what, resp.StatusCode, truncate(body, 400), status, typ)
	}
	return e.Error
}

// startUpload opens a connection and sends a chat request's headers with
// Content-Length n and only the first part of its body: an upload that
// never finishes.
func startUpload(t *testing.T, addr string, n int, part string) net.Conn {
	t.Helper()
	c := dial(t, addr)
	if _, err := fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: kvrouter\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", n, part); err != nil {
		t.Fatal(err)
	}
	return c
}

// rawPost sends a whole request on a new connection and reads the answer.
func rawPost(t *testing.T, addr, body string) (*http.Response, string) {
	t.Helper()
	c := dial(t, addr)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: kvrouter\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// Unfinished uploads hold at most body_budget bytes together: past it a
// request is answered 503 with Retry-After (OpenAI's shape) without being
// read, and the budget comes back whole when the uploads go. Each upload
// here sends all of its body but the last byte (the budget is taken as the
// bytes arrive).
func TestBodyBudgetBoundsUnfinishedUploads(t *testing.T) {
	const limit, budget = 64 << 10, 256 << 10
	rg := newRig(t, 1, func(c *config.Config, _ *fleet.Config) {
		c.BodyLimit, c.BodyBudget = limit, budget
		c.HTTP.BodyIdleTimeout = time.Minute
	})
	addr := rg.runFront()
	held := func() float64 { return testutil.ToFloat64(rg.srv.lm.bodies) }
	var uploads []net.Conn
	for range budget / limit {
		uploads = append(uploads, startUpload(t, addr, limit, `{"model":"m","messages":[`+strings.Repeat(" ", limit-26)))
	}
	pollGauge(t, "kvrouter_proxy_body_held_bytes with the uploads stalled", budget, held)

	resp, body := rawPost(t, addr, chatBody)
	openAIError(t, "a request past body_budget", resp, body, http.StatusServiceUnavailable, typeServiceUnavailable)
	if resp.Header.Get("Retry-After") == "" {
		t.Errorf("503 past body_budget without Retry-After")
	}
	if n := testutil.ToFloat64(rg.srv.lm.bodyRej.WithLabelValues("budget")); n != 1 {
		t.Errorf("body_rejected_total{reason=budget} = %v, want 1", n)
	}
	if n := rg.engines[0].requests.Load(); n != 0 {
		t.Errorf("engine saw %d requests, want 0", n)
	}
	for _, c := range uploads {
		c.Close()
	}
	pollGauge(t, "kvrouter_proxy_body_held_bytes after the uploads left", 0, held)
	if resp, body := rawPost(t, addr, chatBody); resp.StatusCode != 200 {
		t.Fatalf("a request after the burst: %d %s", resp.StatusCode, body)
	}
	pollGauge(t, "kvrouter_proxy_body_held_bytes after a whole request", 0, held)
}

// A body declared over body_limit is refused at once, unread; an upload
// that stops sending is answered 408 after body_idle_timeout.
func TestBodyLimitAndIdleUpload(t *testing.T) {
	rg := newRig(t, 1, func(c *config.Config, _ *fleet.Config) {
		c.BodyLimit = 1 << 10
		c.HTTP.BodyIdleTimeout = 300 * time.Millisecond
	})
	addr := rg.runFront()
	for _, tc := range []struct {
		name   string
		n      int
		status int
	}{
		{"declared over the limit", 1<<10 + 1, http.StatusRequestEntityTooLarge},
		{"stalled mid-body", 1 << 10, http.StatusRequestTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startUpload(t, addr, tc.n, `{"model":`)
			_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			openAIError(t, tc.name, resp, string(b), tc.status, typeInvalidRequest)
		})
	}
	pollGauge(t, "kvrouter_proxy_body_held_bytes", 0, func() float64 { return testutil.ToFloat64(rg.srv.lm.bodies) })
}

// pathRecorder is an engine that records every request line it receives
// and answers each request naming a response 404 (vLLM's answer for an id
// it does not hold).
type pathRecorder struct {
	srv  *httptest.Server
	mu   sync.Mutex
	uris []string
}

func newPathRecorder(t *testing.T) *pathRecorder {
	p := &pathRecorder{}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.uris = append(p.uris, r.Method+" "+r.RequestURI)
		p.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"error":{"message":"Response not found","type":"NotFoundError","param":null,"code":404}}`)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *pathRecorder) seen() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.uris...)
}

// onEngine points the rig's only engine at url.
func onEngine(url string) rigOption {
	return func(c *config.Config, f *fleet.Config) {
		c.Models[0].Engines[0].URL = url
		f.Endpoints[0].URL = url
	}
}

// Response ids with encoded "/", "?" or ".." never become engine path
// structure: the router answers 400 and the engine sees nothing; a valid
// id reaches exactly /v1/responses/{id}[/cancel] with the query
// re-encoded.
func TestResponseIDPathTraversal(t *testing.T) {
	rec := newPathRecorder(t)
	rg := newRig(t, 1, onEngine(rec.srv.URL))
	for _, tc := range []struct{ method, path string }{
		{"POST", "/v1/responses/..%2f..%2freset_prefix_cache%3f/cancel"},
		{"POST", "/v1/responses/..%2F..%2Freset_prefix_cache%3F/cancel"},
		{"GET", "/v1/responses/%2e%2e%2f%2e%2e%2freset_prefix_cache"},
		{"GET", "/v1/responses/..%5c..%5creset_prefix_cache"},
		{"GET", "/v1/responses/resp_a%3fx=1"},
		{"GET", "/v1/responses/resp_a%23frag"},
		{"GET", "/v1/responses/" + strings.Repeat("a", maxResponseID+1)},
	} {
		req, err := http.NewRequest(tc.method, rg.front.URL+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := rg.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		e := openAIError(t, tc.method+" "+tc.path, resp, readAll(t, resp), http.StatusBadRequest, typeInvalidRequest)
		if len(e.Message) > 2*maxEcho+200 {
			t.Errorf("%s: message of %d bytes echoes the id whole", tc.path, len(e.Message))
		}
	}
	if seen := rec.seen(); len(seen) != 0 {
		t.Fatalf("the engine received %q, want nothing", seen)
	}
	id := "resp_0123456789abcdef0123456789abcdef"
	for _, tc := range []struct{ method, path, want string }{
		{"POST", "/v1/responses/" + id + "/cancel", "POST /v1/responses/" + id + "/cancel"},
		{"GET", "/v1/responses/" + id + "?stream=true&starting_after=3", "GET /v1/responses/" + id + "?starting_after=3&stream=true"},
		{"GET", "/v1/responses/" + id + "?x=..%2F..%2Freset_prefix_cache", "GET /v1/responses/" + id + "?x=..%2F..%2Freset_prefix_cache"},
	} {
		req, _ := http.NewRequest(tc.method, rg.front.URL+tc.path, nil)
		resp, err := rg.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if body := readAll(t, resp); resp.StatusCode != http.StatusNotFound {
			t.Fatalf("%s %s: %d %s, want the engine's 404", tc.method, tc.path, resp.StatusCode, body)
		}
		seen := rec.seen()
		if got := seen[len(seen)-1]; got != tc.want {
			t.Errorf("%s %s: engine saw %q, want %q", tc.method, tc.path, got, tc.want)
		}
	}
}

// A client's X-Data-Parallel-Rank is dropped and its kv_transfer_params
// refused, unless clients.allow_* says otherwise.
func TestClientControls(t *testing.T) {
	withParams := `{"model":"m","messages":[{"role":"user","content":"hi"}],"kv_transfer_params":{"do_remote_prefill":true,"remote_host":"10.0.0.9"}}`
	escaped := `{"model":"m","messages":[{"role":"user","content":"hi"}],"kv_transfer_param\u0073":{"do_remote_prefill":true}}`
	inXargs := `{"model":"m","messages":[{"role":"user","content":"hi"}],"vllm_xargs":{"kv_transfer_param\u0073":"x"}}`
	t.Run("default", func(t *testing.T) {
		rg := newRig(t, 1)
		resp := rg.post("/v1/chat/completions", chatBody, RankHeader, "3")
		if body := readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		if v := rg.engines[0].lastHeader().Get(RankHeader); v != "" {
			t.Errorf("engine got %s: %q, want none", RankHeader, v)
		}
		for _, body := range []string{withParams, escaped, inXargs} {
			resp := rg.post("/v1/chat/completions", body)
			e := openAIError(t, "kv_transfer_params from a client", resp, readAll(t, resp), http.StatusBadRequest, typeInvalidRequest)
			if !strings.Contains(e.Message, "allow_kv_transfer_params") {
				t.Errorf("message %q does not name the option", e.Message)
			}
		}
		if n := rg.engines[0].requests.Load(); n != 1 {
			t.Errorf("engine saw %d requests, want 1", n)
		}
		if n := testutil.ToFloat64(rg.srv.lm.clients.WithLabelValues("kv_transfer_params")); n != 3 {
			t.Errorf("client_controls_total{control=kv_transfer_params} = %v, want 3", n)
		}
		if n := testutil.ToFloat64(rg.srv.lm.clients.WithLabelValues("dp_rank")); n != 1 {
			t.Errorf("client_controls_total{control=dp_rank} = %v, want 1", n)
		}
	})
	t.Run("allowed", func(t *testing.T) {
		rg := newRig(t, 1, func(c *config.Config, _ *fleet.Config) {
			c.Clients = config.Clients{AllowDPRank: true, AllowKVTransferParams: true}
		})
		resp := rg.post("/v1/chat/completions", withParams, RankHeader, "3")
		if body := readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		if v := rg.engines[0].lastHeader().Get(RankHeader); v != "3" {
			t.Errorf("engine got %s: %q, want 3", RankHeader, v)
		}
		if b := rg.engines[0].lastBody(); !strings.Contains(string(b), `"remote_host":"10.0.0.9"`) {
			t.Errorf("engine body %s lost kv_transfer_params", b)
		}
	})
}

// With api_key, /metrics needs the key; with admin_listen, the
// introspection paths leave the main listener for the admin one. Echoed
// input is cut.
func TestIntrospectionAndEcho(t *testing.T) {
	get := func(t *testing.T, rg *rig, url, key string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", url, nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := rg.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp, readAll(t, resp)
	}
	t.Run("api_key", func(t *testing.T) {
		rg := newRig(t, 1, func(c *config.Config, _ *fleet.Config) { c.APIKey = "sekret" })
		resp, body := get(t, rg, rg.front.URL+"/metrics", "")
		openAIError(t, "GET /metrics without the key", resp, body, http.StatusUnauthorized, typeAuthentication)
		if resp, body := get(t, rg, rg.front.URL+"/metrics", "sekret"); resp.StatusCode != 200 || !strings.Contains(body, "kvrouter_proxy_connections") {
			t.Fatalf("GET /metrics with the key: %d", resp.StatusCode)
		}
		if resp, _ := get(t, rg, rg.front.URL+"/health", ""); resp.StatusCode != 200 {
			t.Fatalf("GET /health without the key: %d", resp.StatusCode)
		}
	})
	t.Run("admin_listen", func(t *testing.T) {
		rg := newRig(t, 1, func(c *config.Config, _ *fleet.Config) { c.AdminListen = "127.0.0.1:0" })
		resp, body := get(t, rg, rg.front.URL+"/metrics", "")
		openAIError(t, "GET /metrics on the main listener", resp, body, http.StatusNotFound, typeNotFound)
		resp = rg.post("/v1/route", chatBody)
		openAIError(t, "POST /v1/route on the main listener", resp, readAll(t, resp), http.StatusNotFound, typeNotFound)
		resp = rg.post("/v1/chat/completions", chatBody, "X-Kvrouter-Route-Only", "1")
		openAIError(t, "x-kvrouter-route-only on the main listener", resp, readAll(t, resp), http.StatusBadRequest, typeInvalidRequest)
		if n := rg.engines[0].requests.Load(); n != 0 {
			t.Errorf("engine saw %d requests, want 0", n)
		}
		admin := "http://" + rg.runListener(rg.srv.RunAdmin)
		if resp, body := get(t, rg, admin+"/metrics", ""); resp.StatusCode != 200 || !strings.Contains(body, "kvrouter_proxy_connections{listener=\"admin\"} 1") {
			t.Fatalf("GET /metrics on the admin listener: %d", resp.StatusCode)
		}
		req, _ := http.NewRequest("POST", admin+"/v1/route", strings.NewReader(chatBody))
		resp, err := rg.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if body := readAll(t, resp); resp.StatusCode != 200 || !strings.Contains(body, `"replica"`) {
			t.Fatalf("POST /v1/route on the admin listener: %d %s", resp.StatusCode, body)
		}
		if resp, _ := get(t, rg, admin+"/health", ""); resp.StatusCode != 200 {
			t.Fatalf("GET /health on the admin listener: %d", resp.StatusCode)
		}
		// /ready: the engines (their addresses) on the admin listener only.
		resp, body = get(t, rg, admin+"/ready", "")
		if !strings.Contains(body, `"engines":[{"name":`) || !strings.Contains(body, `"total_engines":1`) {
			t.Errorf("GET /ready on the admin listener: %d %s, want the engine listed", resp.StatusCode, body)
		}
		resp, body = get(t, rg, rg.front.URL+"/ready", "")
		if strings.Contains(body, `"engines"`) || strings.Contains(body, "127.0.0.1") || !strings.Contains(body, `"total_engines":1`) {
			t.Errorf("GET /ready on the main listener: %d %s, want counts and no engine", resp.StatusCode, body)
		}
	})
	t.Run("echo", func(t *testing.T) {
		rg := newRig(t, 1)
		name := strings.Repeat("x", 1<<20)
		resp := rg.post("/v1/chat/completions", `{"model":"`+name+`","messages":[{"role":"user","content":"hi"}]}`)
		e := openAIError(t, "unknown 1 MB model", resp, readAll(t, resp), http.StatusNotFound, typeNotFound)
		if len(e.Message) > maxEcho+100 || !strings.Contains(e.Message, "...") {
			t.Errorf("404 message of %d bytes, want the name cut to %d", len(e.Message), maxEcho)
		}
		resp, body := get(t, rg, rg.front.URL+"/"+strings.Repeat("p", 64<<10), "")
		e = openAIError(t, "unknown 64 KB path", resp, body, http.StatusNotFound, typeNotFound)
		if len(e.Message) > maxEcho+100 {
			t.Errorf("404 message of %d bytes, want the path cut to %d", len(e.Message), maxEcho)
		}
	})
}

// Streams from a misbehaving engine end with the router's error event: an
// empty 200 event stream declaring Content-Length: 0, and a stream whose
// engine closes the connection mid-answer (its declared length unmet).
func TestStreamsFromMisbehavingEngine(t *testing.T) {
	for _, tc := range []struct {
		name   string
		events int
		length string
	}{
		{"empty with Content-Length 0", 0, "0"},
		{"exits mid-answer with Content-Length", 2, "100000"},
		{"exits mid-answer chunked", 2, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/v1/chat/completions" {
					return
				}
				_, _ = io.Copy(io.Discard, r.Body)
				conn, brw, err := http.NewResponseController(w).Hijack()
				if err != nil {
					t.Error(err)
					return
				}
				defer conn.Close()
				fmt.Fprintf(brw, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n")
				if tc.length != "" {
					fmt.Fprintf(brw, "Content-Length: %s\r\n\r\n", tc.length)
				} else {
					fmt.Fprintf(brw, "Transfer-Encoding: chunked\r\n\r\n")
				}
				for i := range tc.events {
					ev := fmt.Sprintf("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"}}]}\n\n", i)
					if tc.length == "" {
						ev = fmt.Sprintf("%x\r\n%s\r\n", len(ev), ev)
					}
					brw.WriteString(ev)
				}
				brw.Flush()
			}))
			t.Cleanup(eng.Close)
			rg := newRig(t, 1, onEngine(eng.URL))
			resp := rg.post("/v1/chat/completions", chatStream)
			body := readAll(t, resp)
			if resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			lines := dataLines(body)
			if len(lines) != tc.events+1 {
				t.Fatalf("client got %d data lines %q, want the engine's %d then an error event", len(lines), lines, tc.events)
			}
			var e errorBody
			if err := json.Unmarshal([]byte(strings.TrimPrefix(lines[len(lines)-1], "data: ")), &e); err != nil || e.Error.Type != typeServer || e.Error.Code != http.StatusBadGateway {
				t.Fatalf("last event %q, want the router's error event", lines[len(lines)-1])
			}
		})
	}
}

// FuzzResponseEnginePath: an id validResponseID accepts, with any query,
// always makes an engine URL whose path is /v1/responses/{id} exactly (no
// other segment, no dot segment) and whose query is what the client sent,
// parsed; request.HasTransferParams never panics.
func FuzzResponseEnginePath(f *testing.F) {
	for _, s := range []string{"resp_0123456789abcdef0123456789abcdef", "..%2f..%2freset_prefix_cache%3f", "../x", "a?b", "a#b", "a/b", "", "%2e%2e"} {
		f.Add(s, "stream=true&starting_after=3")
	}
	f.Fuzz(func(t *testing.T, id, rawQuery string) {
		_ = request.HasTransferParams([]byte(id))
		if !validResponseID(id) {
			return
		}
		p, err := responseEnginePath(id, false, rawQuery)
		if err != nil {
			return
		}
		q, _ := url.ParseQuery(rawQuery)
		u, err := url.Parse("http://engine:8000" + p)
		if err != nil {
			t.Fatalf("id %q: %v", id, err)
		}
		if u.Path != responsesPath+"/"+id || u.RawPath != "" || u.Fragment != "" || id == "." || id == ".." {
			t.Fatalf("id %q query %q: engine path %q (raw %q, fragment %q)", id, rawQuery, u.Path, u.RawPath, u.Fragment)
		}
		if got := u.Query(); got.Encode() != q.Encode() {
			t.Fatalf("query %q became %q", q.Encode(), got.Encode())
		}
	})
}

// After a burst of large bodies the memory goes back to the OS within
// seconds (the runtime alone keeps it for minutes): the released heap
// grows by most of what the bodies held.
func TestBodyBurstReturnsMemory(t *testing.T) {
	const size, n = 12 << 20, 6
	rg := newRig(t, 1, func(c *config.Config, _ *fleet.Config) { c.HTTP.BodyIdleTimeout = time.Minute })
	addr := rg.runFront()
	held := func() float64 { return testutil.ToFloat64(rg.srv.lm.bodies) }
	part := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("a", size-100)
	var uploads []net.Conn
	for range n {
		uploads = append(uploads, startUpload(t, addr, size, part))
	}
	pollGauge(t, "kvrouter_proxy_body_held_bytes with the uploads stalled", n*size, held)
	released := func() float64 {
		s := []rtmetrics.Sample{{Name: "/memory/classes/heap/released:bytes"}}
		rtmetrics.Read(s)
		return float64(s[0].Value.Uint64())
	}
	before := released()
	for _, c := range uploads {
		c.Close()
	}
	pollGauge(t, "kvrouter_proxy_body_held_bytes after the uploads left", 0, held)
	deadline := time.Now().Add(30 * time.Second)
	for released()-before < n*size/2 {
		if time.Now().After(deadline) {
			t.Fatalf("released heap grew by %.0f MiB in 30 s after %d MiB of bodies were freed, want at least half", (released()-before)/(1<<20), n*size>>20)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
