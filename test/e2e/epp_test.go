package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"kvrouter/internal/epp"
)

// openAIError checks an ImmediateResponse: status code, OpenAI's error
// JSON with that code and type.
func openAIError(t *testing.T, im *extprocv3.ImmediateResponse, code int, typ string) {
	t.Helper()
	if im == nil {
		t.Fatalf("want an ImmediateResponse %d, got a pick", code)
	}
	if got := int(im.GetStatus().GetCode()); got != code {
		t.Fatalf("status %d, want %d: %s", got, code, im.GetBody())
	}
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    int    `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(im.GetBody(), &e); err != nil || e.Error.Message == "" || e.Error.Code != code || (typ != "" && e.Error.Type != typ) {
		t.Fatalf("body %s: not OpenAI's error JSON with code %d type %q (%v)", im.GetBody(), code, typ, err)
	}
	if ct := setHeaderMap(im.GetHeaders().GetSetHeaders())["content-type"]; ct != "application/json" {
		t.Errorf("content-type %q", ct)
	}
}

type engineUsage struct {
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// TestEPPAgainstEngineSims drives kvrouter epp with the fake gateway
// against two engine-sim processes publishing real KV events.
func TestEPPAgainstEngineSims(t *testing.T) {
	e2eLeakCheck(t)
	bin := e2eBuild(t)
	a, b := startE2ESimProcess(t, bin), startE2ESimProcess(t, bin)
	s := startEPP(t, eppYAML("body_limit: 3145728\n", a, b), 0)
	t.Cleanup(func() { a.stop(); b.stop() }) // before the router unsubscribes (zmq4 race, see startE2ERouterWait)
	s.waitReady(t)
	addrA, addrB := strings.TrimPrefix(a.url, "http://"), strings.TrimPrefix(b.url, "http://")
	ctx := t.Context()
	// Both fronts' in-flight series exist (one family, told apart by
	// front) and return to 0.
	inflightZero := func(t *testing.T) {
		t.Helper()
		text := e2eMetricsText(t, s.url)
		for _, f := range []string{`front="epp"`, `front="http"`} {
			if !strings.Contains(text, "kvrouter_proxy_in_flight_requests{"+f) {
				t.Fatalf("no kvrouter_proxy_in_flight_requests{%s} series", f)
			}
		}
		e2eEventually(t, 10*time.Second, "in-flight back to 0", func() bool {
			return e2eMetric(t, s.url, "kvrouter_proxy_in_flight_requests", `front="epp"`) == 0 &&
				e2eMetric(t, s.url, "kvrouter_proxy_in_flight_requests", `front="http"`) == 0 &&
				e2eMetric(t, s.url, "kvrouter_routing_in_flight_requests") == 0
		})
	}
	// front reads a kvrouter_proxy_* series of the EPP's front.
	front := func(t *testing.T, name string, labels ...string) float64 {
		t.Helper()
		return e2eMetric(t, s.url, name, append([]string{`front="epp"`}, labels...)...)
	}

	t.Run("health", func(t *testing.T) {
		for _, svc := range []string{"", epp.HealthLiveness, epp.HealthReadiness, epp.HealthExtProc} {
			if st, err := s.health(t, svc); err != nil || st != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("health %q: %v %v", svc, st, err)
			}
		}
		if _, err := s.health(t, "nope"); status.Code(err) != codes.NotFound {
			t.Errorf("unknown service: %v, want NotFound", err)
		}
	})

	t.Run("request series with front=epp", func(t *testing.T) {
		const n = 3
		names := []string{"kvrouter_proxy_decision_duration_seconds_count", "kvrouter_proxy_prompt_tokens_count", "kvrouter_proxy_predicted_cached_tokens_count"}
		before := map[string]float64{"requests": front(t, "kvrouter_proxy_requests_total"), "ok": front(t, "kvrouter_proxy_requests_total", `outcome="ok"`),
			"http": e2eMetric(t, s.url, "kvrouter_proxy_requests_total", `front="http"`)}
		for _, name := range names {
			before[name] = front(t, name)
		}
		served := map[string]int{}
		for i := range n {
			r := s.envoy.do(ctx, envoyReq{path: "/v1/chat/completions", body: []byte(e2eChat("You count.", fmt.Sprintf("Say %d.", i)))})
			if r.immediate != nil || r.status != 200 {
				t.Fatal(r)
			}
			served[r.respHeaders["x-kvrouter-replica"]]++
		}
		inflightZero(t)
		if d := front(t, "kvrouter_proxy_requests_total") - before["requests"]; d != n {
			t.Errorf("kvrouter_proxy_requests_total{front=\"epp\"} rose by %v for %d requests", d, n)
		}
		if d := front(t, "kvrouter_proxy_requests_total", `outcome="ok"`) - before["ok"]; d != n {
			t.Errorf("outcome ok rose by %v for %d requests", d, n)
		}
		for rep, k := range served {
			if v := front(t, "kvrouter_proxy_requests_total", `outcome="ok"`, `replica="`+rep+`"`); v < float64(k) {
				t.Errorf("replica %s served %d, counted %v", rep, k, v)
			}
		}
		if d := e2eMetric(t, s.url, "kvrouter_proxy_requests_total", `front="http"`) - before["http"]; d != 0 {
			t.Errorf("the HTTP front counted %v of the EPP's requests", d)
		}
		for _, name := range names {
			if d := front(t, name) - before[name]; d != n {
				t.Errorf("%s{front=\"epp\"} rose by %v for %d picks", name, d, n)
			}
		}
	})

	t.Run("chat", func(t *testing.T) {
		body := e2eChat("You are terse.", "Name a colour.")
		r := s.envoy.do(ctx, envoyReq{path: "/v1/chat/completions", body: []byte(body)})
		if r.immediate != nil {
			t.Fatal(r)
		}
		list := strings.Split(r.dest, ",")
		if r.setHeaders[epp.DestinationKey] != r.dest || len(list) != 2 || !slices.Contains(list, addrA) || !slices.Contains(list, addrB) || list[0] == list[1] {
			t.Fatalf("header %q, metadata %q: want the same primary,fallback over %s and %s", r.setHeaders[epp.DestinationKey], r.dest, addrA, addrB)
		}
		if cl, _ := strconv.Atoi(r.setHeaders["content-length"]); cl != len(r.fwdBody) {
			t.Errorf("content-length %d, body %d bytes", cl, len(r.fwdBody))
		}
		var fwd struct {
			VLLMXArgs map[string]string `json:"vllm_xargs"`
		}
		if err := json.Unmarshal(r.fwdBody, &fwd); err != nil || fwd.VLLMXArgs["kv_cache_report_mode"] != "full" {
			t.Errorf("forwarded body %s: no kv_cache_report_mode (%v)", r.fwdBody, err)
		}
		if r.status != 200 || !strings.Contains(string(r.respBody), `"chat.completion"`) {
			t.Fatalf("response %d %s", r.status, r.respBody)
		}
		if r.respHeaders["x-kvrouter-replica"] == "" || r.respHeaders["x-request-id"] == "" {
			t.Errorf("response headers %v", r.respHeaders)
		}
		inflightZero(t)
	})

	t.Run("completion streamed", func(t *testing.T) {
		body := `{"model":"m","prompt":"Count slowly to twenty:","max_tokens":40,"stream":true,"stream_options":{"include_usage":true}}`
		ttft, itl := front(t, "kvrouter_proxy_time_to_first_token_seconds_count"), front(t, "kvrouter_proxy_inter_token_latency_seconds_count")
		r := s.envoy.do(ctx, envoyReq{path: "/v1/completions", body: []byte(body)})
		if r.immediate != nil || r.status != 200 {
			t.Fatal(r)
		}
		if d := front(t, "kvrouter_proxy_time_to_first_token_seconds_count") - ttft; d != 1 {
			t.Errorf("TTFT observed %v times for one streamed response", d)
		}
		if d := front(t, "kvrouter_proxy_inter_token_latency_seconds_count") - itl; d < 1 || d > float64(r.respChunks-1) {
			t.Errorf("ITL observed %v times over %d chunks", d, r.respChunks)
		}
		if r.respChunks < 2 || !strings.HasSuffix(strings.TrimSpace(string(r.respBody)), "data: [DONE]") {
			t.Fatalf("%d chunks, body ends %q", r.respChunks, r.respBody[max(0, len(r.respBody)-40):])
		}
		inflightZero(t)
		if n := e2eMetric(t, s.url, "kvrouter_epp_usage_tokens_total", `kind="completion"`); n < 40 {
			t.Errorf("usage completion tokens %v, want at least 40 (read from the stream's usage event)", n)
		}
	})

	t.Run("repeat on holder with the engine's cached tokens", func(t *testing.T) {
		system := strings.Repeat("You are a careful assistant for a shipping company. ", 40)
		msgs := []string{system, "Where is parcel 1234? " + strings.Repeat("Details follow. ", 60)}
		first := s.envoy.do(ctx, envoyReq{path: "/v1/chat/completions", body: []byte(e2eChat(msgs...))})
		if first.immediate != nil || first.status != 200 {
			t.Fatal(first)
		}
		holder := first.served
		var fu engineUsage
		if err := json.Unmarshal(first.respBody, &fu); err != nil || fu.Usage.PromptTokens == 0 {
			t.Fatalf("first turn's usage: %v %s", err, first.respBody)
		}
		// Wait for every full block of the first turn's prompt in the index
		// (the sims publish per engine step, the last batch may come a
		// while after the answer): the HTTP front's route-only answer for
		// the first turn then predicts them all.
		want := strconv.Itoa((fu.Usage.PromptTokens - 1) / 16 * 16)
		e2eEventually(t, 20*time.Second, "KV events of the first turn indexed ("+want+" cached tokens predicted)", func() bool {
			req, _ := http.NewRequest(http.MethodPost, s.url+"/v1/chat/completions", strings.NewReader(e2eChat(msgs...)))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Kvrouter-Route-Only", "1")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return false
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode == 200 && resp.Header.Get("X-Kvrouter-Cached-Tokens") == want
		})
		msgs = append(msgs, "It is in Lyon.", "And parcel 99?")
		r := s.envoy.do(ctx, envoyReq{path: "/v1/chat/completions", body: []byte(e2eChat(msgs...))})
		if r.immediate != nil || r.status != 200 {
			t.Fatal(r)
		}
		if got := strings.Split(r.dest, ",")[0]; got != holder {
			t.Fatalf("repeat picked %s, the conversation is on %s", got, holder)
		}
		var u engineUsage
		if err := json.Unmarshal(r.respBody, &u); err != nil {
			t.Fatal(err)
		}
		pred, _ := strconv.Atoi(r.respHeaders["x-kvrouter-cached-tokens"])
		t.Logf("predicted %d cached tokens, engine %d of %d prompt tokens", pred, u.Usage.PromptTokensDetails.CachedTokens, u.Usage.PromptTokens)
		if pred == 0 || pred != u.Usage.PromptTokensDetails.CachedTokens {
			t.Errorf("predicted %d cached tokens, the engine reused %d (prompt %d)", pred, u.Usage.PromptTokensDetails.CachedTokens, u.Usage.PromptTokens)
		}
	})

	t.Run("2 MB body in many chunks", func(t *testing.T) {
		pad := strings.Repeat("x", 2<<20)
		body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"user":%q}`, pad)
		r := s.envoy.do(ctx, envoyReq{path: "/v1/chat/completions", body: []byte(body), chunk: 8 << 10})
		if r.immediate != nil || r.status != 200 {
			t.Fatal(r)
		}
		if !strings.Contains(string(r.fwdBody), pad) || len(r.fwdBody) <= len(body) {
			t.Errorf("forwarded body %d bytes, sent %d: not the body with the merge", len(r.fwdBody), len(body))
		}
		inflightZero(t)
	})

	t.Run("client cancel mid-stream", func(t *testing.T) {
		body := `{"model":"m","prompt":"Write a long story:","max_tokens":400,"stream":true}`
		r := s.envoy.do(ctx, envoyReq{path: "/v1/completions", body: []byte(body), cancelAfter: 1})
		if r.immediate != nil {
			t.Fatal(r)
		}
		inflightZero(t)
		if n := front(t, "kvrouter_proxy_requests_total", `outcome="client_closed"`); n < 1 {
			t.Errorf("client_closed requests %v", n)
		}
	})

	t.Run("subset", func(t *testing.T) {
		body := []byte(e2eChat("s", "pick from the subset"))
		for range 3 {
			r := s.envoy.do(ctx, envoyReq{path: "/v1/chat/completions", body: body, subset: []string{addrB}})
			if r.immediate != nil || r.dest != addrB {
				t.Fatalf("subset [%s]: %v", addrB, r)
			}
		}
		r := s.envoy.do(ctx, envoyReq{path: "/v1/chat/completions", body: body, subset: []string{"10.9.9.9:8000"}})
		openAIError(t, r.immediate, http.StatusServiceUnavailable, "service_unavailable_error")
		r = s.envoy.do(ctx, envoyReq{path: "/v1/chat/completions", body: body, subset: []string{}})
		openAIError(t, r.immediate, http.StatusServiceUnavailable, "service_unavailable_error")
		inflightZero(t)
	})

	t.Run("served elsewhere", func(t *testing.T) {
		before := e2eMetric(t, s.url, "kvrouter_epp_served_elsewhere_total")
		other := func(dest string) string {
			if strings.Split(dest, ",")[0] == addrA {
				return addrB
			}
			return addrA
		}
		body := `{"model":"m","prompt":"Retry me elsewhere, please.","max_tokens":200,"stream":true}`
		r := s.envoy.do(ctx, envoyReq{path: "/v1/completions", body: []byte(body), serveAt: other})
		if r.immediate != nil || r.status != 200 {
			t.Fatal(r)
		}
		if r.respHeaders["x-kvrouter-replica"] == "" || r.served == strings.Split(r.dest, ",")[0] {
			t.Fatalf("served %s, pick %s", r.served, r.dest)
		}
		if n := e2eMetric(t, s.url, "kvrouter_epp_served_elsewhere_total"); n != before+1 {
			t.Errorf("served_elsewhere %v, want %v", n, before+1)
		}
		inflightZero(t)
		if n := front(t, "kvrouter_proxy_requests_total", `outcome="ok"`, `replica="`+r.respHeaders["x-kvrouter-replica"]+`"`); n < 1 {
			t.Errorf("no ok request counted on the served replica %s", r.respHeaders["x-kvrouter-replica"])
		}
	})

	t.Run("bad input", func(t *testing.T) {
		for _, c := range []struct {
			name, path, body string
			code             int
			typ              string
		}{
			{"invalid json", "/v1/chat/completions", `{"model":"m","messages":[`, 400, "invalid_request_error"},
			{"unknown model", "/v1/chat/completions", `{"model":"zz","messages":[{"role":"user","content":"x"}]}`, 404, "not_found_error"},
			{"oversize", "/v1/completions", `{"model":"m","prompt":"` + strings.Repeat("y", 3<<20) + `"}`, 413, "invalid_request_error"},
			{"no body", "/v1/completions", ``, 400, "invalid_request_error"},
		} {
			t.Run(c.name, func(t *testing.T) {
				r := s.envoy.do(ctx, envoyReq{path: c.path, body: []byte(c.body), chunk: 64 << 10})
				openAIError(t, r.immediate, c.code, c.typ)
			})
		}
		inflightZero(t)
	})

	t.Run("body ended by trailers", func(t *testing.T) {
		st, err := s.envoy.ext.Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range []*extprocv3.ProcessingRequest{
			{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
				Headers: hdrs(":method", "POST", ":path", "/v1/completions", "content-type", "application/json")}}},
			{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(`{"model":"m","prompt":"trailers","max_tokens":1}`)}}},
			{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}},
		} {
			if err := st.Send(m); err != nil {
				t.Fatal(err)
			}
		}
		var kinds []string
		for len(kinds) < 3 {
			m, err := st.Recv()
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case m.GetRequestHeaders() != nil:
				kinds = append(kinds, "headers")
			case m.GetRequestBody() != nil:
				if m.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetEndOfStream() {
					t.Error("body end_of_stream set although trailers follow")
				}
				kinds = append(kinds, "body")
			case m.GetRequestTrailers() != nil:
				kinds = append(kinds, "trailers")
			default:
				t.Fatalf("unexpected %T", m.GetResponse())
			}
		}
		if strings.Join(kinds, ",") != "headers,body,trailers" {
			t.Fatalf("answers %v", kinds)
		}
		_ = st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: hdrs(":status", "200"), EndOfStream: true}}})
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
		_ = st.CloseSend()
		inflightZero(t)
	})

	t.Run("malformed sequences", func(t *testing.T) {
		body := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(`{}`), EndOfStream: true}}}
		head := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: hdrs(":method", "POST", ":path", "/v1/completions", "content-type", "application/json")}}}
		respHead := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: hdrs(":status", "200")}}}
		for _, c := range []struct {
			name string
			msgs []*extprocv3.ProcessingRequest
		}{
			{"body before headers", []*extprocv3.ProcessingRequest{body}},
			{"response before the pick", []*extprocv3.ProcessingRequest{respHead}},
			{"headers twice", []*extprocv3.ProcessingRequest{head, head}},
		} {
			t.Run(c.name, func(t *testing.T) {
				im := rawExchange(t, s, c.msgs)
				openAIError(t, im, 500, "server_error")
			})
		}
		t.Run("two end-of-streams", func(t *testing.T) {
			st, err := s.envoy.ext.Process(ctx)
			if err != nil {
				t.Fatal(err)
			}
			good := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
				Body: []byte(`{"model":"m","prompt":"two ends","max_tokens":1}`), EndOfStream: true}}}
			for _, m := range []*extprocv3.ProcessingRequest{head, good, good} {
				if err := st.Send(m); err != nil {
					t.Fatal(err)
				}
			}
			var last *extprocv3.ProcessingResponse
			for {
				m, err := st.Recv()
				if err != nil {
					break
				}
				last = m
			}
			openAIError(t, last.GetImmediateResponse(), 500, "server_error")
		})
		inflightZero(t)
		if n := front(t, "kvrouter_proxy_requests_total", `outcome="protocol_error"`); n < 4 {
			t.Errorf("protocol errors counted %v, want 4", n)
		}
	})
}

// rawExchange sends msgs on a new stream and returns the ImmediateResponse
// the EPP answered (nil if it answered something else).
func rawExchange(t *testing.T, s *eppStack, msgs []*extprocv3.ProcessingRequest) *extprocv3.ImmediateResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	st, err := s.envoy.ext.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if err := st.Send(m); err != nil {
			break // the EPP may close the stream after its answer
		}
	}
	m, err := st.Recv()
	if err != nil {
		t.Fatalf("recv: %v", err)
	}
	return m.GetImmediateResponse()
}

// TestEPPNoReadyEndpoint: with its only engine gone, the EPP answers 503
// with OpenAI's error JSON, and readiness turns NOT_SERVING.
func TestEPPNoReadyEndpoint(t *testing.T) {
	e2eLeakCheck(t)
	sim := startE2ESim(t)
	s := startEPP(t, strings.Replace(eppYAML("", sim), "tokenizer: "+e2eQwen3Dir, "tokenizer: none", 1), 0)
	s.waitReady(t)
	// A fresh EPP exports every kvrouter_epp_* metric docs/epp.md names,
	// and every request series it shares with the HTTP front with a
	// front="epp" series.
	doc, err := os.ReadFile("../../docs/epp.md")
	if err != nil {
		t.Fatal(err)
	}
	names := slices.Compact(slices.Sorted(slices.Values(regexp.MustCompile(`kvrouter_epp_[a-z_]*[a-z]`).FindAllString(string(doc), -1))))
	if len(names) < 4 {
		t.Fatalf("docs/epp.md names %d kvrouter_epp_ metrics: %v", len(names), names)
	}
	text := e2eMetricsText(t, s.url)
	for _, n := range names {
		if !strings.Contains(text, "# TYPE "+n+" ") {
			t.Errorf("documented metric %s absent from a fresh EPP", n)
		}
	}
	for _, n := range []string{"kvrouter_proxy_requests_total", "kvrouter_proxy_in_flight_requests", "kvrouter_proxy_decision_duration_seconds_bucket",
		"kvrouter_proxy_prompt_tokens_bucket", "kvrouter_proxy_predicted_cached_tokens_bucket", "kvrouter_proxy_time_to_first_token_seconds_bucket",
		"kvrouter_proxy_inter_token_latency_seconds_bucket"} {
		if !strings.Contains(text, n+`{front="epp"`) {
			t.Errorf("no %s{front=\"epp\",...} series in a fresh EPP", n)
		}
	}
	body := []byte(`{"model":"m","prompt":[1,2,3],"max_tokens":1}`)
	if r := s.envoy.do(t.Context(), envoyReq{path: "/v1/completions", body: body}); r.immediate != nil || r.status != 200 {
		t.Fatalf("before: %v", r)
	}
	sim.stop()
	e2eEventually(t, 10*time.Second, "readiness NOT_SERVING", func() bool {
		st, err := s.health(t, epp.HealthReadiness)
		return err == nil && st == healthpb.HealthCheckResponse_NOT_SERVING
	})
	r := s.envoy.do(t.Context(), envoyReq{path: "/v1/completions", body: body})
	openAIError(t, r.immediate, http.StatusServiceUnavailable, "service_unavailable_error")
	if ra := setHeaderMap(r.immediate.GetHeaders().GetSetHeaders())["retry-after"]; ra == "" {
		t.Error("no retry-after on the 503")
	}
	if st, _ := s.health(t, epp.HealthLiveness); st != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("liveness %v", st)
	}
}

// TestEPPShed: with max_in_flight 1, a second request while the first
// streams is shed with 429.
func TestEPPShed(t *testing.T) {
	e2eLeakCheck(t)
	sim := startE2ESim(t, e2eProfile("h100-llama3-8b"))
	s := startEPP(t, strings.Replace(eppYAML("", sim), "tokenizer: "+e2eQwen3Dir, "tokenizer: none", 1), 1)
	s.waitReady(t)
	started := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		st, err := s.envoy.ext.Process(ctx)
		if err != nil {
			return
		}
		_ = st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: hdrs(":method", "POST", ":path", "/v1/completions", "content-type", "application/json")}}})
		_ = st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
			Body: []byte(`{"model":"m","prompt":[1,2,3],"max_tokens":1}`), EndOfStream: true}}})
		_, _ = st.Recv() // headers response: the pick holds its lease
		close(started)
		<-ctx.Done()
	}()
	t.Cleanup(func() { <-done })
	<-started
	r := s.envoy.do(t.Context(), envoyReq{path: "/v1/completions", body: []byte(`{"model":"m","prompt":[4,5],"max_tokens":1}`)})
	openAIError(t, r.immediate, http.StatusTooManyRequests, "")
	// The held stream ends with the test's context (cleanup); its lease goes.
}

// TestEPPBodyBudget: the bodies all streams hold are bounded by
// body_budget: while one stream holds most of it unfinished, another's body
// is answered 503 with retry-after, and the budget comes back whole when
// the holder's stream ends.
func TestEPPBodyBudget(t *testing.T) {
	e2eLeakCheck(t)
	sim := startE2ESim(t)
	s := startEPP(t, strings.Replace(eppYAML("body_limit: 1048576\nbody_budget: 1048576\n", sim), "tokenizer: "+e2eQwen3Dir, "tokenizer: none", 1), 0)
	s.waitReady(t)
	headers := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: hdrs(":method", "POST", ":path", "/v1/completions", "content-type", "application/json")}}}
	const held = 700 << 10
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	st, err := s.envoy.ext.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []*extprocv3.ProcessingRequest{headers, {Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
		Body: []byte(`{"model":"m","prompt":"` + strings.Repeat("x", held-23)), EndOfStream: false}}}} {
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	e2eEventually(t, 10*time.Second, "kvrouter_epp_body_held_bytes at the unfinished body's size", func() bool {
		return e2eMetric(t, s.url, "kvrouter_epp_body_held_bytes") == held
	})
	big := []byte(`{"model":"m","prompt":"` + strings.Repeat("y", 400<<10) + `"}`)
	r := s.envoy.do(t.Context(), envoyReq{path: "/v1/completions", body: big, chunk: 64 << 10})
	openAIError(t, r.immediate, http.StatusServiceUnavailable, "service_unavailable_error")
	if ra := setHeaderMap(r.immediate.GetHeaders().GetSetHeaders())["retry-after"]; ra != "1" {
		t.Errorf("retry-after %q on the budget's 503, want 1", ra)
	}
	// The HTTP front of the same process takes from the same budget.
	hr, err := http.Post(s.url+"/v1/completions", "application/json", bytes.NewReader(big))
	if err != nil {
		t.Fatal(err)
	}
	hb, _ := io.ReadAll(hr.Body)
	hr.Body.Close()
	if hr.StatusCode != http.StatusServiceUnavailable || hr.Header.Get("Retry-After") != "1" {
		t.Errorf("HTTP front with the EPP holding the budget: %d (retry-after %q) %s, want 503 with retry-after 1", hr.StatusCode, hr.Header.Get("Retry-After"), hb)
	}
	if n := e2eMetric(t, s.url, "kvrouter_proxy_body_held_bytes"); n != 0 {
		t.Errorf("kvrouter_proxy_body_held_bytes %v after the HTTP front's refusal, want 0", n)
	}
	cancel() // the holder's stream ends: its bytes come back
	e2eEventually(t, 10*time.Second, "kvrouter_epp_body_held_bytes back to 0", func() bool {
		return e2eMetric(t, s.url, "kvrouter_epp_body_held_bytes") == 0
	})
	small := []byte(`{"model":"m","prompt":[1,2,3],"max_tokens":1}`)
	if r := s.envoy.do(t.Context(), envoyReq{path: "/v1/completions", body: small}); r.immediate != nil || r.status != 200 {
		t.Fatalf("after the holder ended: %+v", r)
	}
	if n := e2eMetric(t, s.url, "kvrouter_epp_body_held_bytes"); n != 0 {
		t.Errorf("kvrouter_epp_body_held_bytes %v after every stream ended, want 0", n)
	}
}

// TestEPPDropsClientRank: a client's x-data-parallel-rank is removed from
// the request the gateway forwards (clients.allow_dp_rank is off by
// default) and counted, as the HTTP front drops it.
func TestEPPDropsClientRank(t *testing.T) {
	e2eLeakCheck(t)
	sim := startE2ESim(t)
	s := startEPP(t, strings.Replace(eppYAML("", sim), "tokenizer: "+e2eQwen3Dir, "tokenizer: none", 1), 0)
	s.waitReady(t)
	removed := func(rank bool) []string {
		t.Helper()
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		st, err := s.envoy.ext.Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		h := []string{":method", "POST", ":path", "/v1/completions", "content-type", "application/json"}
		if rank {
			h = append(h, "x-data-parallel-rank", "1")
		}
		for _, m := range []*extprocv3.ProcessingRequest{
			{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs(h...)}}},
			{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
				Body: []byte(`{"model":"m","prompt":[1,2,3],"max_tokens":1}`), EndOfStream: true}}},
		} {
			if err := st.Send(m); err != nil {
				t.Fatal(err)
			}
		}
		m, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		hr := m.GetRequestHeaders()
		if hr == nil {
			t.Fatalf("answer %v, want the pick's request headers response", m)
		}
		return hr.GetResponse().GetHeaderMutation().GetRemoveHeaders()
	}
	if got := removed(false); len(got) != 0 {
		t.Errorf("without the header: removes %v", got)
	}
	before := e2eMetric(t, s.url, "kvrouter_proxy_client_controls_total", `control="dp_rank"`)
	if got := removed(true); !slices.Equal(got, []string{"x-data-parallel-rank"}) {
		t.Errorf("with a client's rank header: removes %v, want [x-data-parallel-rank]", got)
	}
	if n := e2eMetric(t, s.url, "kvrouter_proxy_client_controls_total", `control="dp_rank"`); n != before+1 {
		t.Errorf("kvrouter_proxy_client_controls_total{control=\"dp_rank\"} %v, want %v", n, before+1)
	}
}
