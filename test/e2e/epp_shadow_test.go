package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"kvrouter/internal/epp"
)

// TestEPPShadowAgainstEngineSims: kvrouter epp with model m in policy
// shadow (round_robin serves, kv is evaluated beside it) behind the fake
// gateway, against two engine-sim processes publishing real KV events.
// The picker records one shadow observation per request it picks, under
// front="epp" (none under front="http"), with the prefix kv would have
// found cached: a 257-token prompt whose 256 leading tokens (whole blocks
// for any block size dividing 256; vLLM computes at least the last token)
// are in the index from the first request's KV events, which the engines
// confirm by reporting 256 cached tokens whenever they serve it again.
// Requests answered without a pick (bad JSON, unknown model, no eligible
// endpoint in the subset, shed, passthrough) record none.
func TestEPPShadowAgainstEngineSims(t *testing.T) {
	e2eLeakCheck(t)
	bin := e2eBuild(t)
	a, b := startE2ESimProcess(t, bin), startE2ESimProcess(t, bin)
	yaml := strings.Replace(eppYAML("", a, b), "    routing: ", "    policy: shadow\n    routing: ", 1)
	if !strings.Contains(yaml, "policy: shadow") {
		t.Fatalf("no shadow policy in\n%s", yaml)
	}
	s := startEPP(t, yaml, 1)                // --max-in-flight 1: the shed case below
	t.Cleanup(func() { a.stop(); b.stop() }) // before the router unsubscribes (zmq4 race, see startE2ERouterWait)
	s.waitReady(t)
	ctx := t.Context()

	const promptLen, hit = 257, 256
	ids := make([]int, promptLen)
	for i := range ids {
		ids[i] = 3000 + i
	}
	body := e2eCompletion(ids)
	series := func(front, name string) float64 {
		return e2eMetric(t, s.url, name, `front="`+front+`"`, `model="m"`)
	}
	const decisions, count, sum = "kvrouter_proxy_shadow_decisions_total", "kvrouter_proxy_shadow_cached_tokens_count", "kvrouter_proxy_shadow_cached_tokens_sum"
	// Both fronts' shadow series exist at 0 before the first request.
	text := e2eMetricsText(t, s.url)
	for _, f := range []string{"epp", "http"} {
		for _, agree := range []string{"true", "false"} {
			if l := decisions + `{agree="` + agree + `",front="` + f + `",model="m"} 0`; !strings.Contains(text, l) {
				t.Errorf("no %s at start", l)
			}
		}
		if l := count + `{front="` + f + `",model="m"} 0`; !strings.Contains(text, l) {
			t.Errorf("no %s at start", l)
		}
	}

	// The first request: nothing indexed, kv would have found 0.
	first := s.envoy.do(ctx, envoyReq{path: "/v1/completions", body: []byte(body)})
	if first.immediate != nil || first.status != 200 {
		t.Fatal(first)
	}
	holders := map[string]bool{first.served: true}
	// Its blocks reach the index from the engine's KV events: a dry run on
	// the HTTP front (records no shadow decision) shows kv's hit.
	e2eEventually(t, 15*time.Second, "the first request's blocks indexed", func() bool {
		resp, err := http.Post(s.url+"/v1/route", "application/json", strings.NewReader(body))
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var out struct {
			Shadow *struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"shadow"`
		}
		return resp.StatusCode == 200 && json.NewDecoder(resp.Body).Decode(&out) == nil && out.Shadow != nil && out.Shadow.CachedTokens == hit
	})

	// Repeats: each recorded with kv's full hit; the engines that served
	// the prompt before report that hit themselves.
	const repeats = 4
	confirmed := 0
	for range repeats {
		r := s.envoy.do(ctx, envoyReq{path: "/v1/completions", body: []byte(body)})
		if r.immediate != nil || r.status != 200 {
			t.Fatal(r)
		}
		if holders[r.served] {
			if c := e2eCachedTokens(t, string(r.respBody)); c != hit {
				t.Errorf("engine %s reported %d cached tokens for the repeat, want %d", r.served, c, hit)
			}
			confirmed++
		}
		holders[r.served] = true
	}
	if confirmed == 0 {
		t.Fatalf("no repeat served by an engine that had the prompt: nothing confirms kv's %d", hit)
	}

	// A request picked and left open on the holder of the first, then
	// given up by the client: one observation (kv limited to the subset,
	// where the prompt is cached).
	holdCtx, leave := context.WithCancel(ctx)
	defer leave()
	st, err := s.envoy.ext.Process(holdCtx)
	if err != nil {
		t.Fatal(err)
	}
	hint, _ := structpb.NewStruct(map[string]any{epp.SubsetKey: []any{first.served}})
	for _, m := range []*extprocv3.ProcessingRequest{
		{MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{epp.SubsetNamespace: hint}},
			Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
				Headers: hdrs(":method", "POST", ":path", "/v1/completions", "content-type", "application/json")}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: true}}},
	} {
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if m, err := st.Recv(); err != nil || m.GetRequestHeaders() == nil {
		t.Fatalf("held request: %v %v, want its pick", m, err)
	}

	// Answered without a pick: none of these is a shadow decision.
	for _, c := range []struct {
		name string
		req  envoyReq
		code int
	}{
		{"invalid json", envoyReq{path: "/v1/completions", body: []byte(`{"model":"m","prompt":[`)}, 400},
		{"unknown model", envoyReq{path: "/v1/completions", body: []byte(strings.Replace(body, `"model":"m"`, `"model":"zz"`, 1))}, 404},
		{"no eligible endpoint", envoyReq{path: "/v1/completions", body: []byte(body), subset: []string{"10.9.9.9:8000"}}, 503},
		{"shed", envoyReq{path: "/v1/completions", body: []byte(body), subset: []string{first.served}}, 429},
	} {
		r := s.envoy.do(ctx, c.req)
		if r.immediate == nil {
			t.Fatalf("%s: picked (%v), want %d", c.name, r, c.code)
		}
		openAIError(t, r.immediate, c.code, "")
	}
	if r := s.envoy.do(ctx, envoyReq{method: http.MethodGet, path: "/v1/models"}); r.immediate != nil || r.status != 200 {
		t.Fatalf("passthrough: %v", r)
	}
	leave()
	_, _ = st.Recv()
	e2eEventually(t, 10*time.Second, "the held request ended", func() bool {
		return e2eMetric(t, s.url, "kvrouter_proxy_in_flight_requests", `front="epp"`) == 0
	})

	picked := float64(1 + repeats + 1)
	if n := series("epp", decisions); n != picked {
		t.Errorf("%s{front=\"epp\"} = %v, want %v (one per pick)", decisions, n, picked)
	}
	if n := series("epp", count); n != picked {
		t.Errorf("%s{front=\"epp\"} = %v, want %v", count, n, picked)
	}
	// Every observation is at most the hit (the prompt less one token,
	// whole blocks); the sum says each after the first was exactly it.
	if got, want := series("epp", sum), float64((repeats+1)*hit); got != want {
		t.Errorf("%s{front=\"epp\"} = %v, want %v: %d picks with kv's %d-token hit and the first with none", sum, got, want, repeats+1, hit)
	}
	if got, want := series("epp", "kvrouter_proxy_prompt_tokens_sum"), picked*promptLen; got != want {
		t.Errorf("prompt tokens {front=\"epp\"} = %v, want %v: the shadow hit rate's denominator counts the same picks", got, want)
	}
	for _, name := range []string{decisions, count, sum} {
		if n := series("http", name); n != 0 {
			t.Errorf("%s{front=\"http\"} = %v: the HTTP front counted the picker's requests (or its dry runs)", name, n)
		}
	}
	if t.Failed() {
		t.Logf("shadow series:\n%s", grepLines(e2eMetricsText(t, s.url), "kvrouter_proxy_shadow_"))
	}
}
