package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// BenchmarkAddedLatency measures the latency kvrouter adds to each streamed
// event at 100 and 1,000 concurrent streams, direct and through kvrouter in
// one run, under the same load.
//
// The load is generated in a child process (this test binary re-run as
// TestLoadGenerator): an engine that stamps every SSE event with its send
// time, and clients that record receive time minus send time (one clock),
// first calling the engine directly, then through the kvrouter that this
// process runs (parse, kv routing of a 512-token prompt over an approximate
// index, forward, per-event relay). So this process's CPU time is
// kvrouter's alone: proxy-cpu-µs/event is that time per relayed event
// (user+system, sockets and the Go runtime included). It depends on the
// machine's load: a CPU-starved proxy finds several events per read and
// writes them at once, so it spends less per event (14-16 µs at 1,000
// streams) than one with CPU to spare (19-21 µs), the figure to size by;
// proxy-reads/event tells the two apart (about 2 unstarved, 1 starved).
// loadgen-cpu-µs/event
// is the child's (engine + clients) on the proxied phase. Added latency =
// proxied percentile - direct percentile, in ms. Each stream: 100 events
// 20 ms apart (50 events/s, 2 s); stream starts are spread evenly over 20 ms.
// Each stream's first event is 1 % of the events and follows its request
// within the 20 ms when all 100 requests arrive, so it alone can make the
// p99: added-p99-later-ms is the added p99 without it.
//
// Both measured phases run warm: first the same streams with 5 events
// each go directly, then through the proxy, as in a serving process, whose
// connections are open, whose goroutine stacks and heap pages were
// touched before and whose heap goal follows its working set. A cold
// process instead faults in a fresh page for much of what its first
// streams allocate (about 5 µs each on the 2-core VM, some 2,000 for 100
// streams) and collects its 4 MB minimum heap twice while they start, a
// burst that lands on the first events of every stream (1% of the events,
// so on the p99). Cold, the two proxies' figures also depended on their
// order: the second to run in this process inherits the first one's
// pages and heap (docs/results/2026-12-05-proxy-hop.md).
//
// Where the proxy's CPU goes, per relayed event, over the same window:
// proxy-reads/event and proxy-writes/event are its read(2) and write(2)
// calls (/proc/self/io syscr, syscw: EAGAIN reads included), which fall
// when events batch (several per read) on a CPU-starved machine;
// proxy-sys-cpu-µs/event is the kernel's part of proxy-cpu-µs/event
// (on loopback a write also carries the TCP receive path of the peer's
// socket); proxy-gc-cpu-µs/event is the runtime's estimate of GC CPU
// (/cpu/classes/gc/total); proxy-idle-cpu-ms is this process's CPU during
// the direct phase, when the proxy carries nothing; proxy-cores is the
// CPU over the proxied phase's wall time, which stretches past its 2.02 s
// when streams start late (proxied-s).
//
// proxy=noop runs the same load through net/http/httputil's ReverseProxy
// (flushing every write, no parsing or routing; the request body read
// before forwarding, as kvrouter reads it) instead of kvrouter: the
// added latency of any Go reverse proxy on this machine, so what kvrouter
// adds beyond it is its own (on a CPU-starved machine both tails are the
// scheduler's).
//
//	go test -run '^$' -bench AddedLatency -benchtime 1x ./internal/proxy/
func BenchmarkAddedLatency(b *testing.B) {
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprintf("streams=%d", n), func(b *testing.B) { benchAddedLatency(b, n, false) })
		b.Run(fmt.Sprintf("streams=%d/proxy=noop", n), func(b *testing.B) { benchAddedLatency(b, n, true) })
	}
}

// loadEnv names the environment variable that makes TestLoadGenerator run
// (its value: the number of streams).
const loadEnv = "KVROUTER_BENCH_LOAD_STREAMS"

// warmHeader marks a warm-up request: the engine sends it warmEvents
// events, not the measured 100.
const warmHeader = "X-Bench-Warm-Up"

// loadResult is TestLoadGenerator's report, one JSON line on stdout.
type loadResult struct {
	Events     int           `json:"events"` // per phase
	DirectP50  time.Duration `json:"direct_p50"`
	DirectP99  time.Duration `json:"direct_p99"`
	ProxiedP50 time.Duration `json:"proxied_p50"`
	ProxiedP99 time.Duration `json:"proxied_p99"`
	// The p99s without each stream's first event.
	DirectP99Later  time.Duration `json:"direct_p99_later"`
	ProxiedP99Later time.Duration `json:"proxied_p99_later"`
	DirectCPU       time.Duration `json:"direct_cpu"`  // the child's, direct phase
	ProxiedCPU      time.Duration `json:"proxied_cpu"` // the child's, proxied phase
	ProxiedElapsed  time.Duration `json:"proxied_elapsed"`
}

func benchAddedLatency(b *testing.B, streams int, noop bool) {
	var res loadResult
	var use procUse
	b.ReportAllocs()
	for b.Loop() {
		res, use = runLoad(b, streams, noop)
	}
	ms := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }
	perEvent := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(max(res.Events, 1)) }
	count := func(n int64) float64 { return float64(n) / float64(max(res.Events, 1)) }
	b.ReportMetric(perEvent(use.cpu), "proxy-cpu-µs/event")
	b.ReportMetric(perEvent(use.sys), "proxy-sys-cpu-µs/event")
	b.ReportMetric(perEvent(use.gc), "proxy-gc-cpu-µs/event")
	b.ReportMetric(count(use.reads), "proxy-reads/event")
	b.ReportMetric(count(use.writes), "proxy-writes/event")
	b.ReportMetric(ms(use.idleCPU), "proxy-idle-cpu-ms")
	b.ReportMetric(perEvent(res.ProxiedCPU), "loadgen-cpu-µs/event")
	b.ReportMetric(float64(use.cpu)/float64(res.ProxiedElapsed), "proxy-cores")
	b.ReportMetric(res.ProxiedElapsed.Seconds(), "proxied-s")
	b.ReportMetric(ms(res.DirectP50), "direct-p50-ms")
	b.ReportMetric(ms(res.DirectP99), "direct-p99-ms")
	b.ReportMetric(ms(res.ProxiedP50), "proxy-p50-ms")
	b.ReportMetric(ms(res.ProxiedP99), "proxy-p99-ms")
	b.ReportMetric(ms(res.ProxiedP50-res.DirectP50), "added-p50-ms")
	b.ReportMetric(ms(res.ProxiedP99-res.DirectP99), "added-p99-ms")
	b.ReportMetric(ms(res.ProxiedP99Later-res.DirectP99Later), "added-p99-later-ms")
}

// procUse is this process's resource use over a load run.
type procUse struct {
	cpu, sys, gc  time.Duration // user+sys; its sys part; GC's share (runtime estimate)
	reads, writes int64         // read(2), write(2) calls
	idleCPU       time.Duration // part of cpu spent in the direct phase
}

// procSample reads the counters procUse is the difference of.
func procSample() procUse {
	u := procUse{cpu: cpuTime(), sys: sysTime()}
	gc := []rtmetrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}}
	rtmetrics.Read(gc)
	if gc[0].Value.Kind() == rtmetrics.KindFloat64 {
		u.gc = time.Duration(gc[0].Value.Float64() * 1e9)
	}
	if io, err := os.ReadFile("/proc/self/io"); err == nil {
		for l := range strings.Lines(string(io)) {
			k, v, _ := strings.Cut(strings.TrimSpace(l), ": ")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "syscr":
				u.reads = n
			case "syscw":
				u.writes = n
			}
		}
	}
	return u
}

func (u procUse) sub(v procUse) procUse {
	return procUse{cpu: u.cpu - v.cpu, sys: u.sys - v.sys, gc: u.gc - v.gc, reads: u.reads - v.reads, writes: u.writes - v.writes}
}

// runLoad starts the load generator, serves kvrouter (noop: a plain
// httputil.ReverseProxy) in front of its engine, and returns its report and
// this process's use meanwhile.
func runLoad(b *testing.B, streams int, noop bool) (loadResult, procUse) {
	// Start from the same process state whichever proxy ran before: its
	// pooled buffers would otherwise stay live (raising this run's heap
	// goal) and its freed pages stay mapped (sparing this run's faults).
	// Two collections empty the sync.Pools; the memory goes back to the OS.
	debug.FreeOSMemory()
	debug.FreeOSMemory()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLoadGenerator$", "-test.count=1")
	cmd.Env = append(os.Environ(), loadEnv+"="+strconv.Itoa(streams))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	defer func() {
		stdin.Close()
		// What the child prints after its result (its test failures).
		var rest strings.Builder
		for sc.Scan() {
			if rest.Len() < 8<<10 {
				rest.WriteString(sc.Text())
				rest.WriteByte('\n')
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		if err := cmd.Wait(); err != nil {
			b.Errorf("load generator: %v\n%s", err, rest.String())
		}
	}()
	line := func(prefix string) string {
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), prefix); ok {
				return v
			}
		}
		b.Fatalf("load generator: no %q line (%v)", prefix, sc.Err())
		return ""
	}
	engineURL := line("engine ")
	var h http.Handler
	if noop {
		u, err := url.Parse(engineURL)
		if err != nil {
			b.Fatal(err)
		}
		tr := &http.Transport{MaxIdleConnsPerHost: streams, DisableCompression: true}
		defer tr.CloseIdleConnections()
		rp := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(u) }, Transport: tr, FlushInterval: -1}
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// Read the body here, as kvrouter does (it routes on it):
			// passed through, it is read by the Transport's goroutine
			// while this one writes the answer, and net/http's server
			// then sometimes cancels the request's context (Go 1.27:
			// "use of closed network connection" on the engine side, the
			// client cut after its first event).
			body, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			rp.ServeHTTP(w, r)
		})
	} else {
		srv := newBenchServer(b, engineURL, nil)
		defer srv.closeIdle()
		h = srv.Handler()
	}
	front := httptest.NewServer(h)
	defer front.Close()
	if _, err := fmt.Fprintf(stdin, "proxy %s\n", front.URL); err != nil {
		b.Fatal(err)
	}
	line("warmed")
	u0 := procSample()
	line("proxied")
	idle := cpuTime() - u0.cpu
	out := line("result ")
	use := procSample().sub(u0)
	use.idleCPU = idle
	var res loadResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		b.Fatal(err)
	}
	return res, use
}

// TestLoadGenerator is BenchmarkAddedLatency's child process (it runs only
// when loadEnv is set): it serves the engine, prints "engine URL", reads
// "proxy URL" from stdin, warms up (short streams directly, then through
// the proxy), prints "warmed", drives the streams directly, prints
// "proxied", drives them through the proxy, and prints "result {json}".
func TestLoadGenerator(t *testing.T) {
	v := os.Getenv(loadEnv)
	if v == "" {
		t.Skip("helper process of BenchmarkAddedLatency")
	}
	streams, err := strconv.Atoi(v)
	if err != nil {
		t.Fatal(err)
	}
	const events, warmEvents, gap = 100, 5, 20 * time.Millisecond
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		events := events
		if r.Header.Get(warmHeader) != "" {
			events = warmEvents
		}
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
	defer eng.Close()
	fmt.Printf("engine %s\n", eng.URL)
	proxyLine, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	proxyURL := strings.TrimSpace(strings.TrimPrefix(proxyLine, "proxy "))

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
	// run returns the latencies of every event and of every event but
	// each stream's first, sorted.
	run := func(base string, warm bool) (all, later []time.Duration) {
		events := events
		if warm {
			events = warmEvents
		}
		var mu sync.Mutex
		all = make([]time.Duration, 0, streams*events)
		later = make([]time.Duration, 0, streams*events)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range streams {
			wg.Go(func() {
				<-start
				// Streams start spread over one event gap, as independent
				// clients do, not in lockstep bursts of 1,000 events.
				time.Sleep(gap * time.Duration(i) / time.Duration(streams))
				own := make([]time.Duration, 0, events)
				req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, base+"/v1/completions", bytes.NewReader(body))
				if warm {
					req.Header.Set(warmHeader, "1")
				}
				resp, err := client.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				defer resp.Body.Close()
				sc := bufio.NewScanner(resp.Body)
				for sc.Scan() {
					v, ok := bytes.CutPrefix(sc.Bytes(), []byte(`data: {"t":`))
					if !ok {
						continue
					}
					sent, err := strconv.ParseInt(string(bytes.TrimSuffix(v, []byte("}"))), 10, 64)
					if err != nil {
						t.Error(err)
						return
					}
					own = append(own, time.Duration(time.Now().UnixNano()-sent))
				}
				if len(own) != events {
					t.Errorf("stream got %d events, want %d", len(own), events)
				}
				mu.Lock()
				all = append(all, own...)
				if len(own) > 0 {
					later = append(later, own[1:]...)
				}
				mu.Unlock()
			})
		}
		close(start)
		wg.Wait()
		slices.Sort(all)
		slices.Sort(later)
		return all, later
	}
	pct := func(d []time.Duration, p float64) time.Duration {
		if len(d) == 0 {
			return 0
		}
		return d[min(len(d)-1, int(p*float64(len(d))))]
	}
	// Warm-up, directly then through the proxy, so that each measured
	// phase starts as a serving process does, not as a new one: with
	// connections open, goroutine stacks and heap pages from earlier
	// streams, and a heap goal set by its working set.
	_, _ = run(eng.URL, true)
	_, _ = run(proxyURL, true)
	fmt.Println("warmed")
	c0 := cpuTime()
	direct, directLater := run(eng.URL, false)
	c1 := cpuTime()
	fmt.Println("proxied")
	t0 := time.Now()
	proxied, proxiedLater := run(proxyURL, false)
	res := loadResult{
		Events: len(proxied), ProxiedElapsed: time.Since(t0),
		DirectP50: pct(direct, 0.5), DirectP99: pct(direct, 0.99),
		ProxiedP50: pct(proxied, 0.5), ProxiedP99: pct(proxied, 0.99),
		DirectP99Later: pct(directLater, 0.99), ProxiedP99Later: pct(proxiedLater, 0.99),
		DirectCPU: c1 - c0, ProxiedCPU: cpuTime() - c1,
	}
	out, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("result %s\n", out)
}

// cpuTime returns the process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// sysTime returns the process's system CPU time.
func sysTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Stime.Nano())
}
