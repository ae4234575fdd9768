package e2e

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"kvrouter/internal/enginesim"
)

// otlpReceiver collects the spans exported to it over OTLP, on gRPC (the
// generated TraceService server) or HTTP (protobuf ExportTraceServiceRequest
// bodies at /v1/traces), both from the OpenTelemetry protocol's own
// generated types.
type otlpReceiver struct {
	coltracepb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []*tracepb.Span
}

func (o *otlpReceiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	o.add(req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func (o *otlpReceiver) add(req *coltracepb.ExportTraceServiceRequest) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			o.spans = append(o.spans, ss.GetSpans()...)
		}
	}
}

func (o *otlpReceiver) serveHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var req coltracepb.ExportTraceServiceRequest
	if r.URL.Path != "/v1/traces" || proto.Unmarshal(b, &req) != nil {
		http.Error(w, "bad export", http.StatusBadRequest)
		return
	}
	o.add(&req)
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// trace returns the spans of the trace whose server span has request id.
func (o *otlpReceiver) trace(requestID string) []*tracepb.Span {
	o.mu.Lock()
	defer o.mu.Unlock()
	var tid []byte
	for _, s := range o.spans {
		if attr(s, "kvrouter.request_id") == requestID {
			tid = s.GetTraceId()
		}
	}
	var out []*tracepb.Span
	for _, s := range o.spans {
		if tid != nil && string(s.GetTraceId()) == string(tid) {
			out = append(out, s)
		}
	}
	return out
}

func attr(s interface{ GetAttributes() []*commonpb.KeyValue }, key string) string {
	for _, kv := range s.GetAttributes() {
		if kv.GetKey() == key {
			v := kv.GetValue()
			switch {
			case v.GetStringValue() != "":
				return v.GetStringValue()
			case v.GetIntValue() != 0:
				return strconv.FormatInt(v.GetIntValue(), 10)
			case v.GetBoolValue():
				return "true"
			}
			return ""
		}
	}
	return ""
}

// headerFront relays to target and records each request's traceparent.
type headerFront struct {
	url  string
	mu   sync.Mutex
	seen []string
}

func newHeaderFront(t *testing.T, target string) *headerFront {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.FlushInterval = -1
	f := &headerFront{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/chat/completions" {
			f.mu.Lock()
			f.seen = append(f.seen, r.Header.Get("Traceparent"))
			f.mu.Unlock()
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

func (f *headerFront) traceparents() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.seen...)
}

// TestE2ETracing exports serve's spans over OTLP gRPC and HTTP to an
// in-process receiver and checks the span tree and attributes of a
// streamed chat request (tokenize, route, engine leg under the request
// span, the client's trace continued, traceparent sent to the engine) and
// of a request retried after a 503 (two engine legs).
func TestE2ETracing(t *testing.T) {
	for _, protocol := range []string{"grpc", "http/protobuf"} {
		t.Run(strings.ReplaceAll(protocol, "/", "_"), func(t *testing.T) {
			rcv := &otlpReceiver{}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			endpoint := "http://" + ln.Addr().String()
			if protocol == "grpc" {
				gs := grpc.NewServer()
				coltracepb.RegisterTraceServiceServer(gs, rcv)
				go func() { _ = gs.Serve(ln) }()
				t.Cleanup(gs.Stop)
			} else {
				hs := &http.Server{Handler: http.HandlerFunc(rcv.serveHTTP)}
				go func() { _ = hs.Serve(ln) }()
				t.Cleanup(func() { hs.Close() })
			}
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
			t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
			t.Setenv("OTEL_SERVICE_NAME", "kvrouter-test")

			qwen3 := func(c *enginesim.Config) {
				tok, err := enginesim.LoadTokenizer(e2eQwen3Dir)
				if err != nil {
					t.Fatal(err)
				}
				c.Tokenizer, c.Core.VocabSize = tok, 262144
			}
			bad := startE2ESim(t, qwen3, e2eFaults(enginesim.Faults{ErrorRate: 1, ErrorStatus: 503}))
			good := startE2ESim(t, qwen3)
			badFront, goodFront := newHeaderFront(t, bad.url), newHeaderFront(t, good.url)
			r := startE2ERouter(t, "tokenizer: "+e2eQwen3Dir+"\npolicy: random\nretries: 1\n",
				&e2eSim{url: badFront.url, stop: func() {}}, &e2eSim{url: goodFront.url, stop: func() {}})

			// The client's own traces (one per request): kvrouter's spans
			// continue them. Policy random: requests go to e1 directly or
			// through e0's 503 and a retry; send until both kinds are seen.
			clientParent := "00f067aa0ba902b7"
			var clientTraces []string
			var retried, plain []*tracepb.Span
			for i := 0; i < 20 && (retried == nil || plain == nil); i++ {
				clientTrace := fmt.Sprintf("4bf92f3577b34da6a3ce929d0e0e%04x", i)
				clientTraces = append(clientTraces, clientTrace)
				resp, body := r.post("/v1/chat/completions",
					`{"model":"m","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"tell me about request `+strconv.Itoa(i)+`"}]}`,
					"traceparent", "00-"+clientTrace+"-"+clientParent+"-01")
				if resp.StatusCode != 200 || !strings.Contains(body, "[DONE]") {
					t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
				}
				id := resp.Header.Get("X-Request-Id")
				var spans []*tracepb.Span
				e2eEventually(t, 10*time.Second, "spans exported", func() bool {
					spans = rcv.trace(id)
					return len(spans) > 0 && countName(spans, "kvrouter.engine") > 0 &&
						len(spans) == 3+2*countName(spans, "kvrouter.engine")-1
				})
				switch countName(spans, "kvrouter.engine") {
				case 1:
					plain = spans
				case 2:
					retried = spans
				}
			}
			if retried == nil || plain == nil {
				t.Fatal("20 random picks never gave both a direct and a retried request")
			}
			for _, tr := range [][]*tracepb.Span{plain, retried} {
				root := byName(t, tr, "POST /v1/chat/completions")
				if clientTrace := hex.EncodeToString(root.GetTraceId()); !slices.Contains(clientTraces, clientTrace) || hex.EncodeToString(root.GetParentSpanId()) != clientParent {
					t.Errorf("request span %x/%x does not continue a client's trace %v/%s", root.GetTraceId(), root.GetParentSpanId(), clientTraces, clientParent)
				}
				if root.GetKind() != tracepb.Span_SPAN_KIND_SERVER {
					t.Errorf("request span kind %v", root.GetKind())
				}
				for key, want := range map[string]string{"gen_ai.request.model": "m", "http.response.status_code": "200",
					"kvrouter.outcome": "ok", "kvrouter.replica": "e1"} {
					if got := attr(root, key); got != want {
						t.Errorf("request span %s = %q, want %q", key, got, want)
					}
				}
				if attr(root, "gen_ai.usage.input_tokens") == "" {
					t.Error("request span has no prompt token count")
				}
				for _, name := range []string{"kvrouter.tokenize", "kvrouter.route"} {
					if s := byName(t, tr, name); string(s.GetParentSpanId()) != string(root.GetSpanId()) {
						t.Errorf("%s is not a child of the request span", name)
					}
				}
				var decision bool
				for _, ev := range root.GetEvents() {
					if ev.GetName() == "decision" && attr(ev, "kvrouter.policy") == "random" &&
						strings.Contains(attr(ev, "kvrouter.candidates"), `"replica":"e`) {
						decision = true
					}
				}
				if !decision {
					t.Errorf("request span has no decision event with policy and candidates: %v", root.GetEvents())
				}
			}
			if n := attr(byName(t, retried, "POST /v1/chat/completions"), "kvrouter.retries"); n != "1" {
				t.Errorf("retried request: kvrouter.retries %q, want 1", n)
			}
			var legs []*tracepb.Span
			for _, s := range retried {
				if s.GetName() == "kvrouter.engine" {
					legs = append(legs, s)
				}
			}
			statuses := map[string]string{}
			for _, l := range legs {
				statuses[attr(l, "kvrouter.replica")] = attr(l, "http.response.status_code")
				if l.GetKind() != tracepb.Span_SPAN_KIND_CLIENT {
					t.Errorf("engine span kind %v", l.GetKind())
				}
			}
			if statuses["e0"] != "503" || statuses["e1"] != "200" {
				t.Errorf("retried request's engine legs %v, want e0 503 then e1 200", statuses)
			}
			// Every engine request carried a traceparent naming its own
			// engine span in the client's trace.
			legIDs := map[string]bool{}
			for _, tr := range [][]*tracepb.Span{plain, retried} {
				for _, s := range tr {
					if s.GetName() == "kvrouter.engine" {
						legIDs[hex.EncodeToString(s.GetSpanId())] = true
					}
				}
			}
			sent := map[string]bool{}
			for _, tp := range append(badFront.traceparents(), goodFront.traceparents()...) {
				parts := strings.Split(tp, "-")
				if len(parts) != 4 || !slices.Contains(clientTraces, parts[1]) {
					t.Errorf("engine got traceparent %q, want one of the clients' traces", tp)
					continue
				}
				sent[parts[2]] = true
			}
			for id := range legIDs {
				if !sent[id] {
					t.Errorf("engine span %s: no engine request carried it as traceparent parent", id)
				}
			}
		})
	}
}

func countName(spans []*tracepb.Span, name string) int {
	n := 0
	for _, s := range spans {
		if s.GetName() == name {
			n++
		}
	}
	return n
}

func byName(t *testing.T, spans []*tracepb.Span, name string) *tracepb.Span {
	t.Helper()
	for _, s := range spans {
		if s.GetName() == name {
			return s
		}
	}
	t.Fatalf("no span %q among %d", name, len(spans))
	return nil
}
