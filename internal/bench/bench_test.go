package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"kvrouter/internal/workload"
)

// fakeEngine serves /v1/models, /metrics and a streaming /v1/completions
// that answers max_tokens chunks, reporting half the prompt as cached.
type fakeEngine struct {
	name      string
	status    int  // non-200: answer every completion with it
	cut       bool // end the stream after 2 chunks without [DONE]
	requests  atomic.Int64
	hits, qry atomic.Int64
	sessions  atomic.Int64
	resets    atomic.Int64
}

func (f *fakeEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/v1/models":
		fmt.Fprint(w, `{"object":"list","data":[{"id":"fake-model","object":"model"}]}`)
	case "/reset_prefix_cache":
		f.resets.Add(1)
	case "/metrics":
		fmt.Fprintf(w, "# HELP vllm:prefix_cache_hits_total hits\n# TYPE vllm:prefix_cache_hits_total counter\n")
		fmt.Fprintf(w, "vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"fake-model\"} %d\n", f.hits.Load())
		fmt.Fprintf(w, "vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"fake-model\"} %d\n", f.qry.Load())
		fmt.Fprintf(w, "vllm:num_preemptions_total{engine=\"0\",model_name=\"fake-model\"} 0\n")
	case "/v1/completions":
		var body completionBody
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.Model != "fake-model" || !body.Stream || !body.IgnoreEOS {
			http.Error(w, "bad body", 400)
			return
		}
		f.requests.Add(1)
		if r.Header.Get(SessionHeader) != "" {
			f.sessions.Add(1)
		}
		if f.status != 0 {
			http.Error(w, `{"error":{"message":"busy"}}`, f.status)
			return
		}
		n := len(body.Prompt)
		f.qry.Add(int64(n))
		f.hits.Add(int64(n / 2))
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set(ReplicaHeader, f.name)
		fl := w.(http.Flusher)
		for i := range body.MaxTokens {
			if f.cut && i == 2 {
				return
			}
			time.Sleep(time.Millisecond)
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"text\":\"t%d\",\"finish_reason\":null}],\"usage\":null}\n\n", i)
			fl.Flush()
		}
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\n", n, body.MaxTokens, n/2)
		fmt.Fprint(w, "data: [DONE]\n\n")
	default:
		http.NotFound(w, r)
	}
}

func smallWorkload(t *testing.T, n int) *workload.Workload {
	t.Helper()
	w, err := workload.SharedPrefix{Groups: 2, Prompts: n / 2, SystemTokens: 64, QuestionTokens: 16, OutputTokens: 5}.Generate(nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range w.Requests {
		w.Requests[i].At = time.Duration(i) * 2 * time.Millisecond
	}
	return w
}

func TestRunDirectRoundRobin(t *testing.T) {
	a, b := &fakeEngine{name: "a"}, &fakeEngine{name: "b"}
	sa, sb := httptest.NewServer(a), httptest.NewServer(b)
	defer sa.Close()
	defer sb.Close()
	w := smallWorkload(t, 20)
	run, err := Run(t.Context(), Config{Targets: []string{sa.URL, sb.URL + "/"}, Policy: PolicyRoundRobin, Reset: true}, w, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(run.Samples) != 20 || a.requests.Load() != 10 || b.requests.Load() != 10 {
		t.Fatalf("%d samples, %d/%d requests", len(run.Samples), a.requests.Load(), b.requests.Load())
	}
	if a.resets.Load() != 1 || b.resets.Load() != 1 {
		t.Errorf("resets %d, %d; want 1 each", a.resets.Load(), b.resets.Load())
	}
	if a.sessions.Load() != 10 {
		t.Errorf("session header on %d of 10 requests", a.sessions.Load())
	}
	for _, s := range run.Samples {
		if s.Err != "" || s.OutputTokens != 5 || s.PromptTokens != 80 || s.CachedTokens != 40 ||
			s.FirstToken <= s.Arrival || s.End < s.FirstToken {
			t.Fatalf("sample %+v", s)
		}
	}
	if run.ITL.Count() != 20*4 {
		t.Errorf("ITL gaps %d, want 80", run.ITL.Count())
	}
	if math.Abs(run.EngineHitRate-0.5) > 1e-9 || run.Preemptions != 0 {
		t.Errorf("engine hit rate %v, preemptions %d", run.EngineHitRate, run.Preemptions)
	}
	if len(run.Replicas) != 2 || run.Replicas[1] != sb.URL {
		t.Errorf("replicas %v", run.Replicas)
	}
}

func TestRunRouterMode(t *testing.T) {
	e := &fakeEngine{name: "engine-7"}
	s := httptest.NewServer(e)
	defer s.Close()
	run, err := Run(t.Context(), Config{Name: "kv", Targets: []string{s.URL}}, smallWorkload(t, 6), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if run.Policy != "kv" || !math.IsNaN(run.EngineHitRate) || run.Preemptions != -1 {
		t.Fatalf("run %+v", run)
	}
	for _, s := range run.Samples {
		if s.Replica != "engine-7" || s.Err != "" {
			t.Fatalf("sample %+v", s)
		}
	}
}

func TestRunFailures(t *testing.T) {
	cases := []struct {
		name    string
		engine  *fakeEngine
		wantErr string
	}{
		{"503", &fakeEngine{status: 503}, "http_503"},
		{"cut stream", &fakeEngine{cut: true}, "truncated"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := httptest.NewServer(c.engine)
			defer s.Close()
			run, err := Run(t.Context(), Config{Targets: []string{s.URL}, Policy: PolicyLeastLoad}, smallWorkload(t, 4), nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range run.Samples {
				if s.Err != c.wantErr {
					t.Fatalf("err %q, want %q", s.Err, c.wantErr)
				}
			}
		})
	}
	// Unreachable target: every request fails, the run still returns.
	s := httptest.NewServer(&fakeEngine{})
	url := s.URL
	s.Close()
	run, err := Run(t.Context(), Config{Model: "m", Targets: []string{url}, Policy: PolicyRandom}, smallWorkload(t, 4), nil, nil)
	if err != nil || len(run.Samples) != 4 || run.Samples[0].Err != "connect" {
		t.Fatalf("run %+v, %v", run, err)
	}
	if _, err := Run(t.Context(), Config{Targets: []string{url}}, smallWorkload(t, 4), nil, nil); err == nil {
		t.Fatal("no model and unreachable target: want an error")
	}
}

func TestConfigErrors(t *testing.T) {
	bad := []Config{
		{},
		{Targets: []string{"a", "b"}, Policy: PolicyRouter},
		{Targets: []string{"a"}, Policy: "nope"},
	}
	for _, cfg := range bad {
		if _, err := Run(t.Context(), cfg, &workload.Workload{}, nil, nil); err == nil {
			t.Errorf("config %+v accepted", cfg)
		}
	}
}

func TestRunCancel(t *testing.T) {
	s := httptest.NewServer(&fakeEngine{})
	defer s.Close()
	w := smallWorkload(t, 10)
	w.Requests[9].At = time.Hour
	// The first 9 arrive within 16 ms; the deadline ends the wait for the
	// 10th (1 h away) and leaves a loaded machine time to send the 9.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	run, err := Run(ctx, Config{Targets: []string{s.URL}}, w, nil, nil)
	if err != nil || len(run.Samples) != 9 {
		t.Fatalf("%d samples, %v", len(run.Samples), err)
	}
}

func TestProgress(t *testing.T) {
	if got := progressLine("kv", 10, 6, 5, 1, 1500*time.Millisecond); got != "\rkv [###############---------------] 5/10 done, 1 in flight, 1 errors, 1.5s " {
		t.Fatalf("%q", got)
	}
	var buf bytes.Buffer
	s := httptest.NewServer(&fakeEngine{})
	defer s.Close()
	if _, err := Run(t.Context(), Config{Targets: []string{s.URL}, Progress: &buf}, smallWorkload(t, 4), nil, nil); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "4/4 done") || !strings.HasSuffix(buf.String(), "\n") {
		t.Fatalf("progress output %q", buf.String())
	}
	if IsTerminal(&buf) {
		t.Fatal("a buffer is not a terminal")
	}
}

func TestParseCounters(t *testing.T) {
	page := `# HELP vllm:prefix_cache_hits_total x
vllm:prefix_cache_hits_total{engine="0",model_name="a\"}b"} 10
vllm:prefix_cache_hits_total{engine="1"} 5 1700000000000
vllm:prefix_cache_queries_total 100
vllm:prefix_cache_queries_total_created 1.7e9
vllm:num_preemptions_total{x="y"} 3.0
other_metric NaN
`
	c, err := parseCounters(strings.NewReader(page))
	if err != nil || c != (counters{15, 100, 3}) {
		t.Fatalf("%+v, %v", c, err)
	}
	for _, bad := range []string{"vllm:prefix_cache_hits_total{a=\"b\" 1", "vllm:prefix_cache_hits_total x"} {
		if _, err := parseCounters(strings.NewReader(bad)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%q: err %v", bad, err)
		}
	}
}

func TestSSEReader(t *testing.T) {
	in := ": comment\r\nevent: x\r\ndata: {\"choices\":[{\"text\":\"a\"}]}\r\n\r\ndata: [DONE]\n\ndata: tail"
	r := newSSEReader(strings.NewReader(in))
	var got []string
	for {
		d, err := r.next()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			break
		}
		got = append(got, string(d))
	}
	if len(got) != 3 || got[0] != `{"choices":[{"text":"a"}]}` || got[1] != "[DONE]" || got[2] != "tail" {
		t.Fatalf("%q", got)
	}
}

// FuzzSSE feeds arbitrary bytes through the SSE reader and chunk decoder:
// never a panic; decode errors wrap ErrMalformed.
func FuzzSSE(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"index\":0,\"text\":\"hi\",\"finish_reason\":null}],\"usage\":null}\n\ndata: [DONE]\n\n"))
	f.Add([]byte("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":2}}}\n\n"))
	f.Add([]byte("data: {\"error\":{\"message\":\"x\",\"code\":500}}\n\n"))
	f.Add([]byte("data: a\ndata: b\n\n\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		r := newSSEReader(bytes.NewReader(in))
		for range 1000 {
			d, err := r.next()
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, ErrMalformed) {
					t.Fatalf("reader error %v", err)
				}
				return
			}
			ev, err := parseData(d)
			if err != nil && !errors.Is(err, ErrMalformed) {
				t.Fatalf("decode error %v", err)
			}
			_ = ev.c.hasToken()
		}
	})
}

// TestRunSendPanic: a panic while sending one request (here from the
// transport) is recorded as that sample's Err "panic", releases its target
// and does not crash the run.
func TestRunSendPanic(t *testing.T) {
	client := &http.Client{Transport: rtFunc(func(r *http.Request) (*http.Response, error) {
		if r.URL.Path == "/v1/completions" {
			panic("boom")
		}
		return nil, errors.New("down") // metrics scrape
	})}
	run, err := Run(t.Context(), Config{Model: "m", Targets: []string{"http://127.0.0.1:1"}, Policy: PolicyLeastLoad}, smallWorkload(t, 4), client, nil)
	if err != nil || len(run.Samples) != 4 {
		t.Fatalf("run %+v, %v", run, err)
	}
	for _, s := range run.Samples {
		if s.Err != "panic" {
			t.Errorf("sample %s err %q, want panic", s.ID, s.Err)
		}
	}
}

type rtFunc func(*http.Request) (*http.Response, error)

func (f rtFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
