package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/enginesim"
)

// BenchmarkPickLatency compares, on the same prompts and in one run, the
// EPP's picker latency (request headers and body sent on an ext_proc
// stream to the headers response with the pick received) with the HTTP
// front's decision latency (a route-only request, x-kvrouter-route-only:
// 1, sent to its decision received), at 100 and 1,000 concurrent streams
// or connections (and 1, the latency without queueing). Both parse, tokenize (Qwen3, ~600-token chats) and
// route with the kv policy over 4 engines; the EPP's request also takes a
// lease, released by its response's end. Reported: p50 and p99 in µs per
// request, measured at the client.
//
//	go test -run XXX -bench PickLatency -benchtime 4000x ./test/e2e/
func BenchmarkPickLatency(b *testing.B) {
	var sims []*e2eSim
	for range 4 {
		sims = append(sims, startBenchSim(b))
	}
	s := startEPP(b, eppYAML("", sims...), 0)
	s.waitReady(b)
	prompts := make([][]byte, 200)
	system := strings.Repeat("You are a careful assistant for a shipping company. ", 40)
	for i := range prompts {
		prompts[i] = []byte(e2eChat(system, fmt.Sprintf("Question %d: where is parcel %d? %s", i, i*7919, strings.Repeat("More detail. ", 20))))
	}
	for _, streams := range []int{1, 100, 1000} {
		for _, front := range []string{"epp", "http"} {
			b.Run(fmt.Sprintf("front=%s/streams=%d", front, streams), func(b *testing.B) {
				one := s.eppPick
				if front == "http" {
					hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: streams}}
					defer hc.CloseIdleConnections()
					one = func(body []byte) (time.Duration, error) { return routeOnly(hc, s.url, body) }
				}
				lat := make([]time.Duration, 0, b.N)
				var mu sync.Mutex
				var next atomic.Int64
				var failed atomic.Int64
				b.ResetTimer()
				var wg sync.WaitGroup
				for range streams {
					wg.Go(func() {
						for {
							i := next.Add(1) - 1
							if i >= int64(b.N) {
								return
							}
							d, err := one(prompts[i%int64(len(prompts))])
							if err != nil {
								failed.Add(1)
								continue
							}
							mu.Lock()
							lat = append(lat, d)
							mu.Unlock()
						}
					})
				}
				wg.Wait()
				b.StopTimer()
				if n := failed.Load(); n > 0 {
					b.Fatalf("%d of %d requests failed", n, b.N)
				}
				slices.Sort(lat)
				q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) }
				b.ReportMetric(q(0.5), "p50-µs")
				b.ReportMetric(q(0.99), "p99-µs")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}

// eppPick runs one exchange up to the pick, then ends the response at
// once (a 200 with an empty body) so the lease is released.
func (s *eppStack) eppPick(body []byte) (time.Duration, error) {
	st, err := s.envoy.ext.Process(s.ctx)
	if err != nil {
		return 0, err
	}
	t0 := time.Now()
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: hdrs(":method", "POST", ":path", "/v1/chat/completions", "content-type", "application/json")}}}); err != nil {
		return 0, err
	}
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}); err != nil {
		return 0, err
	}
	m, err := st.Recv()
	d := time.Since(t0)
	if err != nil {
		return 0, err
	}
	if m.GetRequestHeaders() == nil {
		return 0, fmt.Errorf("no pick: %v", m)
	}
	for {
		m, err := st.Recv()
		if err != nil {
			return 0, err
		}
		if m.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetEndOfStream() {
			break
		}
	}
	_ = st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: hdrs(":status", "200", "content-type", "application/json"), EndOfStream: true}}})
	_, _ = st.Recv()
	_ = st.CloseSend()
	_, _ = st.Recv()
	return d, nil
}

func routeOnly(hc *http.Client, url string, body []byte) (time.Duration, error) {
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Kvrouter-Route-Only", "1")
	t0 := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	resp.Body.Close()
	d := time.Since(t0)
	if resp.StatusCode != 200 {
		return 0, fmt.Errorf("route-only %d: %s", resp.StatusCode, buf.Bytes())
	}
	return d, nil
}

// startBenchSim is an in-process engine-sim (no KV events: the
// approximate index learns from the picks) for benchmarks.
func startBenchSim(b *testing.B) *e2eSim {
	b.Helper()
	srv, err := enginesim.New(enginesim.Config{Core: enginesim.CoreConfig{Profile: enginesim.ProfileFast, MaxModelLen: 32768, NumGPUBlocks: 4096},
		ServedModelName: "m"}, nil, prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	b.Cleanup(func() { cancel(); <-done })
	return &e2eSim{url: "http://" + ln.Addr().String(), stop: cancel}
}
