package e2e

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"kvrouter/internal/epp"
)

// TestEPPRemovedEngineSeries: an engine removed from the pool (kvrouter epp
// --config reloads router.yaml) while the EPP has a request open on it keeps its front="epp"
// series until that request ends, then loses them, as the HTTP front
// loses its own.
func TestEPPRemovedEngineSeries(t *testing.T) {
	e2eLeakCheck(t)
	a, b := startE2ESim(t), startE2ESim(t)
	yaml := func(sims ...[2]string) string { return reloadYAML("round_robin", sims...) }
	cm := newConfigMapDir(t, yaml([2]string{"a", a.url}, [2]string{"b", b.url}))
	// kvrouter epp --config polls router.yaml as serve does.
	s := startEPP(t, yaml([2]string{"a", a.url}, [2]string{"b", b.url}), 0, func(fl *eppFlags) {
		// As kvrouter epp --config FILE --config-poll 20ms --listen 127.0.0.1:0.
		fl.serve = configOptions(t, cm.path(), 20*time.Millisecond, "127.0.0.1:0")
	})
	s.waitReady(t)
	body := []byte(`{"model":"m","prompt":[1,2,3],"max_tokens":1}`)
	addrA := strings.TrimPrefix(a.url, "http://")
	// One request through a, whole: its requests_total series.
	if r := s.envoy.do(t.Context(), envoyReq{path: "/v1/completions", body: body, subset: []string{addrA}}); r.immediate != nil || r.status != 200 {
		t.Fatalf("request on a: %v", r)
	}
	// A passthrough (not an inference request) to a: counted under a's
	// name, as the picks are.
	if r := s.envoy.do(t.Context(), envoyReq{method: http.MethodGet, path: "/v1/models", subset: []string{addrA}}); r.immediate != nil || r.status != 200 || r.dest != addrA {
		t.Fatalf("passthrough to a: %v", r)
	}
	if n := e2eMetric(t, s.url, "kvrouter_proxy_requests_total", `front="epp"`, `outcome="passthrough"`, `replica="a"`); n != 1 {
		t.Errorf("passthrough requests on a = %v, want 1:\n%s", n, grepLines(e2eMetricsText(t, s.url), "passthrough"))
	}
	// A second stays open on a: picked, no response yet.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	st, err := s.envoy.ext.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hint, _ := structpb.NewStruct(map[string]any{epp.SubsetKey: []any{addrA}})
	for _, m := range []*extprocv3.ProcessingRequest{
		{MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{epp.SubsetNamespace: hint}},
			Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
				Headers: hdrs(":method", "POST", ":path", "/v1/completions", "content-type", "application/json")}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}},
	} {
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if m, err := st.Recv(); err != nil || m.GetRequestHeaders() == nil {
		t.Fatalf("held request: %v %v, want its pick", m, err)
	}
	eppA := func(name string) float64 {
		return e2eMetric(t, s.url, name, `front="epp"`, `replica="a"`)
	}
	if n := eppA("kvrouter_proxy_in_flight_requests"); n != 1 {
		t.Fatalf("in flight on a through the EPP = %v, want 1", n)
	}

	cm.write(yaml([2]string{"b", b.url}))
	e2eEventually(t, 10*time.Second, "a removed from the pool", func() bool {
		return e2eMetric(t, s.url, "kvrouter_pool_engines", `model="m"`) == 1
	})
	// The HTTP front's series of a go at once (no request of its own on a).
	e2eEventually(t, 10*time.Second, "the HTTP front's series of a gone", func() bool {
		return e2eMetric(t, s.url, "kvrouter_proxy_in_flight_requests", `front="http"`, `replica="a"`) == 0 &&
			!strings.Contains(grepLines(e2eMetricsText(t, s.url), `replica="a"`), `front="http"`)
	})
	// The open request still holds a's EPP series.
	if n := eppA("kvrouter_proxy_in_flight_requests"); n != 1 {
		t.Errorf("in flight on removed a while its request is open = %v, want 1", n)
	}
	if n := eppA("kvrouter_proxy_requests_total"); n != 2 {
		t.Errorf("requests on removed a while its request is open = %v, want 2 (the finished one, the passthrough)", n)
	}
	cancel() // the client leaves: the request ends, counted client_closed
	e2eEventually(t, 10*time.Second, "a's front=\"epp\" series gone after its last request", func() bool {
		text := e2eMetricsText(t, s.url)
		return !strings.Contains(text, `replica="a"`) && !strings.Contains(text, `replica="`+addrA+`"`)
	})
	if r := s.envoy.do(t.Context(), envoyReq{path: "/v1/completions", body: body}); r.immediate != nil || r.status != 200 || r.dest != strings.TrimPrefix(b.url, "http://") {
		t.Errorf("after the removal: %v, want b", r)
	}
	if strings.Contains(e2eMetricsText(t, s.url), `replica="a"`) {
		t.Errorf("series of removed a came back:\n%s", grepLines(e2eMetricsText(t, s.url), `replica="a"`))
	}
}

// TestEPPTokenizeSeriesFront: the tokenizer's series are per front, as the
// request series are: a request picked by the EPP is tokenized (local
// tokenizer) under front="epp", one the same process's HTTP front serves
// under front="http".
func TestEPPTokenizeSeriesFront(t *testing.T) {
	e2eLeakCheck(t)
	sim := startE2ESim(t)
	s := startEPP(t, eppYAML("", sim), 0)
	s.waitReady(t)
	count := func(front string) float64 {
		return e2eMetric(t, s.url, "kvrouter_proxy_tokenize_duration_seconds_count", `front="`+front+`"`, `model="m"`)
	}
	for _, f := range []string{"epp", "http"} {
		if !strings.Contains(e2eMetricsText(t, s.url), `kvrouter_proxy_tokenize_errors_total{front="`+f+`",model="m"} 0`) {
			t.Errorf("no kvrouter_proxy_tokenize_errors_total{front=%q} series at start", f)
		}
	}
	body := `{"model":"m","prompt":"the tokenizer counts this under its front","max_tokens":1}`
	if r := s.envoy.do(t.Context(), envoyReq{path: "/v1/completions", body: []byte(body)}); r.immediate != nil || r.status != 200 {
		t.Fatalf("through the EPP: %v", r)
	}
	if e, h := count("epp"), count("http"); e != 1 || h != 0 {
		t.Errorf("after one EPP request: tokenized epp %v, http %v; want 1, 0", e, h)
	}
	resp, err := http.Post(s.url+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("HTTP front: %d", resp.StatusCode)
	}
	if e, h := count("epp"), count("http"); e != 1 || h != 1 {
		t.Errorf("after one request on each front: tokenized epp %v, http %v; want 1, 1", e, h)
	}
}
