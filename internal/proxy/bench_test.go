package proxy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/fleet"
)

// BenchmarkAddedLatency measures the latency kvrouter adds to each streamed
// event at 100 and 1,000 concurrent streams, in one run: the engine stamps every SSE
// event with its send time, and the client (same process, same clock)
// records receive time minus send time, once calling the engine directly
// and once through the proxy (parse, kv routing over an approximate index,
// forward, per-event relay). Added latency = proxy percentile - direct
// percentile. Each stream: a 512-token completion prompt, 20 events 20 ms
// apart; stream starts are spread evenly over 20 ms.
//
//	go test -run '^$' -bench AddedLatency -benchtime 1x ./internal/proxy/
func BenchmarkAddedLatency(b *testing.B) {
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprintf("streams=%d", n), func(b *testing.B) { benchAddedLatency(b, n) })
	}
}

func benchAddedLatency(b *testing.B, streams int) {
	const events, gap = 20, 20 * time.Millisecond
	eng := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		w.WriteHeader(200)
		_ = rc.Flush()
		t := time.NewTicker(gap)
		defer t.Stop()
		buf := make([]byte, 0, 64)
		for range events {
			buf = append(buf[:0], `data: {"t":`...)
			buf = strconv.AppendInt(buf, time.Now().UnixNano(), 10)
			buf = append(buf, "}\n\n"...)
			if _, err := w.Write(buf); err != nil {
				return
			}
			_ = rc.Flush()
			select {
			case <-t.C:
			case <-r.Context().Done():
				return
			}
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	eng.Config.MaxHeaderBytes = 1 << 16
	eng.Start()
	defer eng.Close()

	reg := prometheus.NewRegistry()
	fl, err := fleet.New(fleet.Config{Endpoints: []fleet.EndpointConfig{{Name: "e0", URL: eng.URL, Models: []string{"m"}}},
		ProbeInterval: -1, ScrapeInterval: -1}, nil, reg)
	if err != nil {
		b.Fatal(err)
	}
	be, err := NewBackend(BackendConfig{Model: "m", Replicas: []string{"e0"}, Policy: "kv"}, nil, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	cfg := Config{Models: []ModelConfig{{Name: "m", Tokenizer: TokenizerNone, Engines: []EngineConfig{{Name: "e0", URL: eng.URL}}}}}
	cfg.FillDefaults(func(string) string { return "" })
	srv, err := New(cfg, Deps{Fleet: fl, Routers: map[string]Router{"m": be}}, nil, reg)
	if err != nil {
		b.Fatal(err)
	}
	front := httptest.NewServer(srv.Handler())
	defer front.Close()
	defer srv.closeIdle()

	var prompt bytes.Buffer
	prompt.WriteString(`{"model":"m","stream":true,"max_tokens":20,"prompt":[`)
	for i := range 512 {
		if i > 0 {
			prompt.WriteByte(',')
		}
		prompt.WriteString(strconv.Itoa(1000 + i))
	}
	prompt.WriteString(`]}`)
	body := prompt.Bytes()

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: streams, DisableCompression: true}}
	defer client.CloseIdleConnections()
	run := func(base, path string) []time.Duration {
		var mu sync.Mutex
		lat := make([]time.Duration, 0, streams*events)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range streams {
			wg.Go(func() {
				<-start
				// Streams start spread over one event gap, as independent
				// clients do, not in lockstep bursts of 1,000 events.
				time.Sleep(gap * time.Duration(i) / time.Duration(streams))
				own := make([]time.Duration, 0, events)
				req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, base+path, bytes.NewReader(body))
				resp, err := client.Do(req)
				if err != nil {
					b.Error(err)
					return
				}
				defer resp.Body.Close()
				sc := bufio.NewScanner(resp.Body)
				for sc.Scan() {
					line := sc.Bytes()
					v, ok := bytes.CutPrefix(line, []byte(`data: {"t":`))
					if !ok {
						continue
					}
					sent, err := strconv.ParseInt(string(bytes.TrimSuffix(v, []byte("}"))), 10, 64)
					if err != nil {
						b.Error(err)
						return
					}
					own = append(own, time.Duration(time.Now().UnixNano()-sent))
				}
				if len(own) != events {
					b.Errorf("stream got %d events, want %d", len(own), events)
				}
				mu.Lock()
				lat = append(lat, own...)
				mu.Unlock()
			})
		}
		close(start)
		wg.Wait()
		slices.Sort(lat)
		return lat
	}
	pct := func(d []time.Duration, p float64) time.Duration {
		if len(d) == 0 {
			return 0
		}
		return d[min(len(d)-1, int(p*float64(len(d))))]
	}
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	b.ReportAllocs()
	var direct, proxied []time.Duration
	var cpuDirect, cpuProxied time.Duration
	for b.Loop() {
		c0 := cpuTime()
		direct = run(eng.URL, "/v1/completions")
		c1 := cpuTime()
		proxied = run(front.URL, "/v1/completions")
		cpuDirect, cpuProxied = c1-c0, cpuTime()-c1
	}
	// The process's CPU time (user+sys) spent by the proxy per relayed
	// event: what bounds throughput per core.
	b.ReportMetric(us(cpuProxied-cpuDirect)/float64(max(len(proxied), 1)), "proxy-cpu-µs/event")
	b.ReportMetric(us(pct(direct, 0.5)), "direct-p50-µs")
	b.ReportMetric(us(pct(direct, 0.99)), "direct-p99-µs")
	b.ReportMetric(us(pct(proxied, 0.5)), "proxy-p50-µs")
	b.ReportMetric(us(pct(proxied, 0.99)), "proxy-p99-µs")
	b.ReportMetric(us(pct(proxied, 0.5)-pct(direct, 0.5)), "added-p50-µs")
	b.ReportMetric(us(pct(proxied, 0.99)-pct(direct, 0.99)), "added-p99-µs")
}

// cpuTime returns the process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
