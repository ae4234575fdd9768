package proxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/admission"
	"kvrouter/internal/config"
	"kvrouter/internal/fleet"
	"kvrouter/internal/group"
	"kvrouter/internal/request"
	"kvrouter/internal/tokenizer"
)

// benchChunk is one streamed chat event as vLLM sends it (OpenAI
// chat.completion.chunk, one token of content).
const benchChunk = `data: {"id":"chatcmpl-6f1c2a9e4b7d4c21","object":"chat.completion.chunk","created":1732890000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"content":" the"},"logprobs":null,"finish_reason":null}]}` + "\n\n"

// eventReader yields one event per Read, as an engine's stream arrives
// (one event per TCP segment), n events then EOF.
type eventReader struct {
	ev []byte
	n  int
}

func (r *eventReader) Read(p []byte) (int, error) {
	if r.n == 0 {
		return 0, io.EOF
	}
	r.n--
	return copy(p, r.ev), nil
}

// flushDiscard is a ResponseWriter that drops bytes and counts flushes.
type flushDiscard struct {
	h       http.Header
	flushes int
}

func (w *flushDiscard) Header() http.Header         { return w.h }
func (w *flushDiscard) Write(p []byte) (int, error) { return len(p), nil }
func (w *flushDiscard) WriteHeader(int)             {}
func (w *flushDiscard) FlushError() error           { w.flushes++; return nil }

// newBenchServer returns a Server over one engine URL routing model "m"
// with the production kv Backend (approximate index).
func newBenchServer(tb testing.TB, url string, tok group.Tokenizer) *Server {
	tb.Helper()
	reg := prometheus.NewRegistry()
	fl, err := fleet.New(fleet.Config{Endpoints: []fleet.EndpointConfig{{Name: "e0", URL: url, Models: []string{"m"}}},
		ProbeInterval: -1, ScrapeInterval: -1}, nil, reg)
	if err != nil {
		tb.Fatal(err)
	}
	be, err := group.NewBackend(group.BackendConfig{Model: "m", Replicas: []string{"e0"}, Policy: "kv"}, nil, nil, nil)
	if err != nil {
		tb.Fatal(err)
	}
	cfg := config.Config{Models: []config.Model{{Name: "m", Tokenizer: config.TokenizerNone, Engines: []config.Engine{{Name: "e0", URL: url}}}}}
	cfg.FillDefaults(func(string) string { return "" })
	deps := Deps{Fleet: fl, Routers: map[string]group.Router{"m": be}}
	if tok != nil {
		deps.Tokenizers = map[string]group.Tokenizer{"m": tok}
	}
	srv, err := New(cfg, deps, nil, reg)
	if err != nil {
		tb.Fatal(err)
	}
	return srv
}

// BenchmarkRelayEvent measures kvrouter's own CPU per relayed SSE event:
// the copyEvents loop (event framing, flush, watchdog, TTFT/ITL metrics)
// between an in-memory engine body that yields one event per Read and a
// ResponseWriter that discards. Sockets, net/http framing and the kernel
// are excluded (see BenchmarkAddedLatency's proxy-cpu-µs/event for those);
// this is the part the proxy code controls, independent of machine load.
//
//	go test -run '^$' -bench RelayEvent -benchtime 1s ./internal/proxy/
func BenchmarkRelayEvent(b *testing.B) {
	const perStream = 1000
	srv := newBenchServer(b, "http://127.0.0.1:1", nil)
	buf := make([]byte, 32<<10)
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	w := &flushDiscard{h: http.Header{}}
	x := &exchange{w: w, r: r, Flow: admission.Flow{Ctx: r.Context(), Start: time.Now(), Req: &request.Parsed{Model: "m"}}}
	x.hooks = newHooks(x)
	b.ReportAllocs()
	events := 0
	for b.Loop() {
		wd := newWatchdog(func(error) {}, time.Minute, time.Minute)
		body := &eventReader{ev: []byte(benchChunk), n: perStream}
		if _, err := srv.copyEvents(x, wd, body, buf, func() {}, func() {}); err != nil {
			b.Fatal(err)
		}
		wd.stop()
		events += perStream
	}
	if w.flushes != events {
		b.Fatalf("%d flushes for %d events", w.flushes, events)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(events), "ns/event")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkRouteOverhead measures the per-request work kvrouter adds before
// forwarding: parse the body, tokenize, route with the kv policy over the
// approximate index, build the forwarded body. chat: a typical chat
// request (system prompt + user question, ~590 tokens, Qwen3 chat template
// and tokenizer, local); token-ids: a completion with a 512-id prompt (no
// tokenizing). Every request shares its prefix, so the index lookup finds
// one.
//
//	go test -run '^$' -bench RouteOverhead -benchtime 1s ./internal/proxy/
func BenchmarkRouteOverhead(b *testing.B) {
	tok, err := tokenizer.Load("../../testdata/tokenizer/qwen3")
	if err != nil {
		b.Fatal(err)
	}
	local, err := tokenizer.NewLocal(tok, tokenizer.ContentAuto)
	if err != nil {
		b.Fatal(err)
	}
	src, err := tokenizer.NewSource(local, nil)
	if err != nil {
		b.Fatal(err)
	}
	system := strings.Repeat("You are a careful assistant for a logistics company. Answer with the shipment id, the carrier and the expected delivery date; never invent data. ", 20)
	var ids bytes.Buffer
	for i := range 512 {
		fmt.Fprintf(&ids, "%d,", 1000+i)
	}
	for _, tc := range []struct {
		name      string
		k         request.Kind
		body      func(i int) []byte
		minTokens int
	}{
		{"chat", request.Chat, func(i int) []byte {
			return fmt.Appendf(nil, `{"model":"m","stream":true,"max_tokens":256,"messages":[{"role":"system","content":%q},{"role":"user","content":"Where is shipment %d? It left Rotterdam on Monday."}]}`, system, i)
		}, 500},
		{"token-ids", request.Completion, func(i int) []byte {
			return fmt.Appendf(nil, `{"model":"m","stream":true,"max_tokens":256,"prompt":[%s%d]}`, ids.Bytes(), i)
		}, 513},
	} {
		b.Run(tc.name, func(b *testing.B) {
			srv := newBenchServer(b, "http://127.0.0.1:1", admission.TokenSource{Src: src})
			b.ReportAllocs()
			i, tokens := 0, 0
			for b.Loop() {
				i++
				r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil).WithContext(context.Background())
				x := &exchange{w: httptest.NewRecorder(), r: r, Flow: admission.Flow{Ctx: r.Context(), Header: r.Header.Get, Start: time.Now()}}
				x.hooks = newHooks(x)
				if !srv.parse(x.Ctx, x, tc.k, tc.body(i)) {
					b.Fatal("parse failed")
				}
				d, err := srv.core.Decide(x.Ctx, &x.Flow, srv.core.RouteInput(x.Ctx, &x.Flow, []string{"e0"}, false))
				if err != nil {
					b.Fatal(err)
				}
				if d.Release != nil {
					d.Release()
				}
				tokens = len(x.Tokens)
			}
			if tokens < tc.minTokens {
				b.Fatalf("prompt has %d tokens, want >= %d", tokens, tc.minTokens)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e6, "ms/request")
			b.ReportMetric(float64(tokens), "prompt-tokens")
		})
	}
}
