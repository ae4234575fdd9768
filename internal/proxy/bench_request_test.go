package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"encoding/json/jsontext"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/admission"
	"kvrouter/internal/group"
	"kvrouter/internal/request"
	"kvrouter/internal/tokenizer"
)

var updateBody = flag.Bool("update", false, "rewrite testdata/chat-100k.json from its generator")

// chat100kPath is the 100K-token chat request of the request-path
// benchmarks: 494 KB, 102K Qwen3 tokens once rendered (see
// TestChat100kBody). It is generated, not hand-written:
//
//	go test -run TestChat100kBody -update ./internal/proxy/
const chat100kPath = "testdata/chat-100k.json"

// genChat100k builds the benchmark conversation deterministically: a
// system prompt and 95 alternating user/assistant turns (the last a user's, as a chat request ends) of sentences
// drawn (PCG seeded 25) from the words of the Qwen3 golden prose texts.
func genChat100k(tb testing.TB) []byte {
	tb.Helper()
	f, err := os.Open("../../testdata/tokenizer/qwen3/encode.jsonl")
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	seen := map[string]bool{}
	var words []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var c struct {
			Text string `json:"text"`
		}
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			tb.Fatal(err)
		}
		for _, w := range strings.Fields(c.Text) {
			ascii := len(w) <= 14
			for i := 0; i < len(w) && ascii; i++ {
				ascii = w[i] >= 'a' && w[i] <= 'z'
			}
			if ascii && !seen[w] {
				seen[w] = true
				words = append(words, w)
			}
		}
	}
	if len(words) < 100 {
		tb.Fatalf("only %d words in the golden prose", len(words))
	}
	rng := rand.New(rand.NewPCG(25, 25))
	para := func(sentences int) string {
		var b strings.Builder
		for s := range sentences {
			if s > 0 {
				b.WriteString(" ")
			}
			n := 6 + rng.IntN(14)
			for i := range n {
				w := words[rng.IntN(len(words))]
				if i == 0 {
					w = strings.ToUpper(w[:1]) + w[1:]
				} else {
					b.WriteString(" ")
				}
				b.WriteString(w)
				if i > 0 && i < n-1 && rng.IntN(9) == 0 {
					b.WriteString(",")
				}
			}
			b.WriteString(".")
			if rng.IntN(5) == 0 {
				b.WriteString("\n\n")
			}
		}
		return b.String()
	}
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := []msg{{"system", "You are a careful assistant. " + para(20)}}
	for i := range 95 {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, msg{role, para(70)})
	}
	body, err := json.Marshal(struct {
		Model     string `json:"model"`
		Messages  []msg  `json:"messages"`
		MaxTokens int    `json:"max_tokens"`
		Stream    bool   `json:"stream"`
	}{"m", msgs, 256, true})
	if err != nil {
		tb.Fatal(err)
	}
	return append(body, '\n')
}

// TestChat100kBody checks that the committed benchmark body is its
// generator's output (rewritten with -update).
func TestChat100kBody(t *testing.T) {
	want := genChat100k(t)
	if *updateBody {
		if err := os.WriteFile(chat100kPath, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(chat100kPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s (%d bytes) is not the generator's output (%d bytes); rerun with -update", chat100kPath, len(got), len(want))
	}
}

// continued returns body with one more turn: the assistant's answer to
// its last message and a new user question (a conversation's next
// request, which resends the history).
func continued(tb testing.TB, body []byte, turn int) []byte {
	tb.Helper()
	i := bytes.LastIndex(body, []byte(`],"max_tokens"`))
	if i < 0 {
		tb.Fatal("benchmark body has no messages end")
	}
	add := fmt.Sprintf(`,{"role":"assistant","content":"The shipment left the depot on Monday and arrives on Thursday (turn %d)."},{"role":"user","content":"Thank you. Which carrier takes it for the last mile, and is a signature needed on delivery? (turn %d)"}`, turn, turn)
	out := make([]byte, 0, len(body)+len(add))
	out = append(out, body[:i]...)
	out = append(out, add...)
	return append(out, body[i:]...)
}

// freshConversation returns body as a new conversation (its system prompt
// starts with a number, so nothing it holds was seen before).
func freshConversation(body []byte, n int) []byte {
	const at = `"content":"You are`
	i := bytes.Index(body, []byte(at))
	out := make([]byte, 0, len(body)+16)
	out = append(out, body[:i+len(`"content":"`)]...)
	out = fmt.Appendf(out, "[%d] ", n)
	return append(out, body[i+len(`"content":"`):]...)
}

// routeRequest takes one chat body through the request path up to the
// forward (parse, template, tokens, keys, kv decision) and returns its
// prompt's token count.
func routeRequest(tb testing.TB, srv *Server, body []byte) int {
	n, _ := routeDecision(tb, srv, body)
	return n
}

// routeDecision is routeRequest with the decision.
func routeDecision(tb testing.TB, srv *Server, body []byte) (int, group.Decision) {
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil).WithContext(context.Background())
	x := &exchange{w: httptest.NewRecorder(), r: r, Flow: admission.Flow{Ctx: r.Context(), Header: r.Header.Get, Start: time.Now()}}
	if !srv.parse(x.Ctx, x, request.Chat, body) {
		tb.Fatal("parse failed")
	}
	d, err := srv.core.Decide(x.Ctx, &x.Flow, srv.core.RouteInput(x.Ctx, &x.Flow, []string{"e0"}, false))
	if err != nil {
		tb.Fatal(err)
	}
	if d.Release != nil {
		d.Release()
	}
	return len(x.Tokens), d
}

// measuredRequest is routeRequest for the measured requests only, so
// that tools/callgrind-request.sh counts their instructions alone
// (--toggle-collect on this function).
//
//go:noinline
func measuredRequest(b *testing.B, srv *Server, body []byte) int { return routeRequest(b, srv, body) }

// counterValue reads the counter name from reg (0 when absent).
func counterValue(tb testing.TB, reg *prometheus.Registry, name string) float64 {
	tb.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

// BenchmarkRequestCPU measures the whole request path of one chat request
// (JSON, chat template, tokenization, block keys, kv routing over the
// approximate index, forwarded body) on testdata/chat-100k.json (494 KB,
// 101K tokens, Qwen3 template and tokenizer, local, with the default
// prefix cache), as CPU time per request (getrusage around each timed
// request: GC and every goroutine of the process included) beside wall
// time. conv=new: every request is a new conversation (its
// first message differs); conv=continue: the conversation continued by one
// turn, after its previous request was routed (the history is resent).
//
//	go test -run '^$' -bench RequestCPU -benchtime 200x -count 6 ./internal/proxy/
func BenchmarkRequestCPU(b *testing.B) {
	tok, err := tokenizer.Load("../../testdata/tokenizer/qwen3")
	if err != nil {
		b.Fatal(err)
	}
	local, err := tokenizer.NewLocal(tok, tokenizer.ContentAuto)
	if err != nil {
		b.Fatal(err)
	}
	cacheReg := prometheus.NewRegistry()
	cache, err := tokenizer.NewPrefixCache(tokenizer.PrefixCacheConfig{Model: "m"}, cacheReg)
	if err != nil {
		b.Fatal(err)
	}
	src, err := tokenizer.NewSource(local.WithPrefixCache(cache), nil)
	if err != nil {
		b.Fatal(err)
	}
	base, err := os.ReadFile(chat100kPath)
	if err != nil {
		b.Fatal(err)
	}
	next := 0 // conversation numbers: unique in the whole run, so no request finds what it should not
	for _, tc := range []struct {
		name string
		cont bool // continue a conversation routed just before (untimed)
	}{{"conv=new/tokens=100k", false}, {"conv=continue/tokens=100k", true}} {
		b.Run(tc.name, func(b *testing.B) {
			srv := newBenchServer(b, "http://127.0.0.1:1", admission.TokenSource{Src: src})
			route := func(body []byte) int { return routeRequest(b, srv, body) }
			next++
			tokens := route(freshConversation(base, next)) // warms the word cache, as a running router's is
			b.ReportAllocs()
			b.ResetTimer()
			var cpu time.Duration
			var hits, hitKeys float64 // prefix cache hits, and block keys taken from it, of the measured requests
			for i := 0; i < b.N; i++ {
				// Bodies are built, and a continued conversation's
				// previous turn routed, outside the timed and CPU-counted
				// part.
				b.StopTimer()
				next++
				body := freshConversation(base, next)
				if tc.cont {
					route(body)
					body = continued(b, body, next)
				}
				h0 := counterValue(b, cacheReg, "kvrouter_tokenizer_prefix_cache_hits_total")
				k0 := counterValue(b, cacheReg, "kvrouter_tokenizer_prefix_cache_hit_keys_total")
				b.StartTimer()
				c0 := cpuTime()
				n := measuredRequest(b, srv, body)
				cpu += cpuTime() - c0
				b.StopTimer() // the counters are read untimed (a registry Gather allocates)
				hits += counterValue(b, cacheReg, "kvrouter_tokenizer_prefix_cache_hits_total") - h0
				hitKeys += counterValue(b, cacheReg, "kvrouter_tokenizer_prefix_cache_hit_keys_total") - k0
				b.StartTimer()
				if tc.cont {
					tokens = n
				}
			}
			b.StopTimer()
			if tokens < 100_000 {
				b.Fatalf("prompt has %d tokens, want >= 100,000", tokens)
			}
			if want := map[bool]float64{false: 0, true: float64(b.N)}[tc.cont]; hits != want {
				b.Fatalf("%v prefix cache hits in %d requests, want %v", hits, b.N, want)
			}
			if tc.cont && hitKeys < float64(b.N*((tokens-128)/16)) { // all but the new turn's blocks (under 128 tokens)
				b.Fatalf("%v block keys from the prefix cache in %d continuations of %d tokens", hitKeys, b.N, tokens)
			}
			b.ReportMetric(cpu.Seconds()/float64(b.N)*1e3, "cpu-ms/op")
			b.ReportMetric(float64(b.N)/cpu.Seconds(), "req/cpu-s")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e6, "ms/op")
			b.ReportMetric(float64(tokens), "prompt-tokens")
		})
	}
}

// BenchmarkDecodeChat100k compares decoders on testdata/chat-100k.json:
// the one-pass decode the router uses (tokenizer.DecodeDocument: raw
// fields and ordered template values), the standard library's
// encoding/json (Go 1.27: the v2 implementation) into any, and its
// jsontext tokenizer reading every token (syntax only, no values built).
//
//	go test -run '^$' -bench DecodeChat100k -benchtime 100x ./internal/proxy/
func BenchmarkDecodeChat100k(b *testing.B) {
	body, err := os.ReadFile(chat100kPath)
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		decode func() error
	}{
		{"decoder=document", func() error { _, err := tokenizer.DecodeDocument(body); return err }},
		{"decoder=encoding-json-any", func() error { var v any; return json.Unmarshal(body, &v) }},
		{"decoder=jsontext-tokens", func() error {
			d := jsontext.NewDecoder(bytes.NewReader(body))
			for {
				if _, err := d.ReadToken(); err == io.EOF {
					return nil
				} else if err != nil {
					return err
				}
			}
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			var cpu time.Duration
			for b.Loop() {
				c0 := cpuTime()
				if err := tc.decode(); err != nil {
					b.Fatal(err)
				}
				cpu += cpuTime() - c0
			}
			b.ReportMetric(cpu.Seconds()/float64(b.N)*1e3, "cpu-ms/op")
		})
	}
}
