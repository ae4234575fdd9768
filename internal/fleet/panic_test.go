package fleet

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// lockedBuf is a log sink safe for concurrent writes.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Engine health modes of a stallEngine.
const (
	healthOK    = iota // /health answers 200
	healthStall        // /health answers nothing until the probe gives up
	health503          // /health answers 503 (vLLM: engine dead)
)

// stallEngine is a real loopback HTTP server whose /health can answer,
// stall (a starved engine: the probe times out) or answer 503.
type stallEngine struct {
	srv  *httptest.Server
	mode atomic.Int32
}

func newStallEngine(t *testing.T) *stallEngine {
	t.Helper()
	e := &stallEngine{}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch e.mode.Load() {
		case healthStall:
			<-r.Context().Done() // the client's timeout ends the wait
		case health503:
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(e.srv.Close)
	return e
}

// panicFleet builds a fleet over the engines (model "m") on a clock the
// test moves, logging into the returned buffer.
func panicFleet(t *testing.T, cfg Config, engines ...*stallEngine) (*Fleet, *lockedBuf, *time.Time) {
	t.Helper()
	now := time.Unix(1000, 0)
	cfg.Now = func() time.Time { return now }
	cfg.ProbeTimeout = 100 * time.Millisecond
	for i, e := range engines {
		cfg.Endpoints = append(cfg.Endpoints, EndpointConfig{Name: string(rune('a' + i)), URL: e.srv.URL, Models: []string{"m"}})
	}
	logs := &lockedBuf{}
	f, err := New(cfg, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.cfg.Client.CloseIdleConnections)
	return f, logs, &now
}

func healthyNames(t *testing.T, f *Fleet) string {
	t.Helper()
	eps, _, err := f.Healthy(nil, "m")
	if err != nil {
		return err.Error()
	}
	return strings.Join(names(eps), ",")
}

// TestPanicModeProbeTimeouts: two engines on loopback whose /health
// stalls, as a CPU- or memory-starved host's does. One probe timeout
// ejects nothing; two eject for timeouts; when both engines time out the
// model enters panic mode (gauge 1, one log line) and requests are routed
// over both instead of "no healthy endpoint". An engine whose /health
// answers 503 is a definite failure and leaves the panic set; one that
// recovers ends panic mode (gauge 0, one log line).
func TestPanicModeProbeTimeouts(t *testing.T) {
	a, b := newStallEngine(t), newStallEngine(t)
	f, logs, now := panicFleet(t, Config{ProbeInterval: time.Second}, a, b)
	ea, eb := f.Endpoint("a"), f.Endpoint("b")
	ctx := t.Context()
	f.probe(ctx, ea)
	f.probe(ctx, eb)
	if !f.Ready() || healthyNames(t, f) != "a,b" {
		t.Fatalf("after good probes: ready %v, healthy %s", f.Ready(), healthyNames(t, f))
	}

	a.mode.Store(healthStall)
	f.probe(ctx, ea)
	if !ea.Up() {
		t.Fatal("one probe timeout ejected a")
	}
	if n := testutil.ToFloat64(f.m.probes.WithLabelValues("a", "timeout")); n != 1 {
		t.Errorf("probes{result=timeout} = %v, want 1", n)
	}
	f.probe(ctx, ea)
	if ea.Up() || healthyNames(t, f) != "b" {
		t.Fatalf("two timeouts: a up %v, healthy %s; want a out", ea.Up(), healthyNames(t, f))
	}
	if n := testutil.ToFloat64(f.m.ejections.WithLabelValues("a", "probe_timeout")); n != 1 {
		t.Errorf("ejections{reason=probe_timeout} = %v", n)
	}
	if f.Panic("m") || testutil.ToFloat64(f.m.panic.WithLabelValues("m")) != 0 {
		t.Fatal("panic mode with half the engines up (threshold 0.5)")
	}

	b.mode.Store(healthStall)
	f.probe(ctx, eb)
	f.probe(ctx, eb)
	if eb.Up() {
		t.Fatal("b still up after two timeouts")
	}
	for range 3 {
		if got := healthyNames(t, f); got != "a,b" {
			t.Fatalf("every engine timing out: healthy %q, want a,b (panic mode)", got)
		}
	}
	if !f.Panic("m") || testutil.ToFloat64(f.m.panic.WithLabelValues("m")) != 1 {
		t.Fatal("kvrouter_fleet_panic_mode not 1")
	}
	if n := strings.Count(logs.String(), "msg=\"panic mode: too few endpoints up"); n != 1 {
		t.Errorf("%d panic log lines, want 1:\n%s", n, logs)
	}
	if st := f.States("m"); !st[0].Panic || st[0].Up || !st[0].Routable() || !f.Ready() {
		t.Errorf("states in panic mode %+v, ready %v; want routed, routable, ready", st, f.Ready())
	}

	b.mode.Store(health503)
	f.probe(ctx, eb)
	if got := healthyNames(t, f); got != "a" {
		t.Fatalf("b answering 503: healthy %q, want a alone", got)
	}
	if n := testutil.ToFloat64(f.m.ejections.WithLabelValues("b", "probe")); n != 0 {
		t.Errorf("b already down: ejections{probe} = %v, want 0", n)
	}

	b.mode.Store(healthOK)
	*now = now.Add(time.Minute) // past any backoff
	f.probe(ctx, eb)
	if got := healthyNames(t, f); got != "b" {
		t.Fatalf("b recovered: healthy %q, want b (1 of 2 up: no panic)", got)
	}
	if f.Panic("m") || testutil.ToFloat64(f.m.panic.WithLabelValues("m")) != 0 {
		t.Fatal("panic mode not over")
	}
	if n := strings.Count(logs.String(), "msg=\"panic mode over\""); n != 1 {
		t.Errorf("%d 'panic mode over' lines, want 1:\n%s", n, logs)
	}
}

// TestPanicModeDefiniteFailures: engines that refuse connections or answer
// 503 from /health are dead, not slow: they stay out even when every
// engine of the model is down, and the client gets "no healthy endpoint"
// (a 503 with Retry-After from the proxy) instead of a certain failure.
func TestPanicModeDefiniteFailures(t *testing.T) {
	a, b := newStallEngine(t), newStallEngine(t)
	f, _, _ := panicFleet(t, Config{ProbeInterval: time.Second}, a, b)
	b.mode.Store(health503)
	a.srv.Close() // connection refused
	f.probe(t.Context(), f.Endpoint("a"))
	f.probe(t.Context(), f.Endpoint("b"))
	if _, _, err := f.Healthy(nil, "m"); !errors.Is(err, ErrNoEndpoint) {
		t.Fatalf("refused and 503: err %v, want ErrNoEndpoint", err)
	}
	if !f.Panic("m") {
		t.Error("0 of 2 up is below the threshold: panic gauge should say so")
	}
	if f.Ready() {
		t.Error("ready with both engines dead")
	}
}

// TestPanicModePassive: outcomes the proxy reports, classed from real
// errors on loopback: a request that times out (a stalled engine) takes
// the model's only engine out for timeouts, so it is still routed; a
// refused connection is definite and takes it out for real.
func TestPanicModePassive(t *testing.T) {
	e := newStallEngine(t)
	e.mode.Store(healthStall)
	f, _, _ := panicFleet(t, Config{ProbeInterval: -1}, e)
	ep := f.Endpoint("a")
	c := &http.Client{Timeout: 50 * time.Millisecond}
	_, err := c.Get(e.srv.URL + "/v1/completions")
	if o := OutcomeOfError(err); o != OutcomeTimeout {
		t.Fatalf("stalled request: %v classed %v, want timeout", err, o)
	}
	f.Report(ep, OutcomeOfError(err))
	if ep.Up() {
		t.Fatal("timeout did not eject")
	}
	if got := healthyNames(t, f); got != "a" {
		t.Fatalf("only engine down for a timeout: healthy %q, want a", got)
	}
	e.srv.Close()
	_, err = c.Get(e.srv.URL + "/v1/completions")
	if o := OutcomeOfError(err); o != OutcomeConnError {
		t.Fatalf("refused: %v classed %v, want conn_error", err, o)
	}
	f.Report(ep, OutcomeOfError(err))
	if _, _, err := f.Healthy(nil, "m"); !errors.Is(err, ErrNoEndpoint) {
		t.Fatalf("after a refused connection: %v, want ErrNoEndpoint", err)
	}
	if n := testutil.ToFloat64(f.m.ejections.WithLabelValues("a", "timeout")); n != 1 {
		t.Errorf("ejections{reason=timeout} = %v, want 1", n)
	}
	c.CloseIdleConnections()
}

// TestPanicThreshold: which engines are routed for a share of engines
// down for timeouts, per threshold.
func TestPanicThreshold(t *testing.T) {
	tests := []struct {
		name      string
		n, down   int
		threshold float64
		want      int // endpoints Healthy returns
		panic     bool
	}{
		{"default, 1 of 4 down", 4, 1, 0, 3, false},
		{"default, 2 of 4 down: half up is not below half", 4, 2, 0, 2, false},
		{"default, 3 of 4 down", 4, 3, 0, 4, true},
		{"default, the only engine down", 1, 1, 0, 1, true},
		{"0.8, 1 of 4 down", 4, 1, 0.8, 4, true},
		{"1, 1 of 10 down", 10, 1, 1, 10, true},
		{"off, all down", 3, 3, -1, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var eps []EndpointConfig
			for i := range tt.n {
				eps = append(eps, EndpointConfig{URL: fmt.Sprintf("http://h:%d", 1+i), Models: []string{"m"}})
			}
			now := time.Unix(1000, 0)
			f, _ := newTestFleet(t, Config{Endpoints: eps, ProbeInterval: time.Second, PanicThreshold: tt.threshold, Now: func() time.Time { return now }})
			for _, ep := range f.All()[:tt.down] {
				f.Report(ep, OutcomeTimeout)
			}
			got, _, err := f.Healthy(nil, "m")
			if len(got) != tt.want || (tt.want == 0) != errors.Is(err, ErrNoEndpoint) {
				t.Errorf("healthy %v (err %v), want %d", names(got), err, tt.want)
			}
			if f.Panic("m") != tt.panic {
				t.Errorf("panic %v, want %v", f.Panic("m"), tt.panic)
			}
		})
	}
	if _, err := New(Config{Endpoints: twoEndpoints(), PanicThreshold: 1.5}, nil, nil); err == nil || !strings.Contains(err.Error(), "panic threshold 1.5") {
		t.Errorf("threshold 1.5: %v", err)
	}
}

// TestPanicModeConcurrent: requests calling Healthy on many goroutines
// while ejections and re-admissions flip the panic state; under -race, and
// at the end the gauge agrees with the state and every entering line has
// its leaving line or is the current state.
func TestPanicModeConcurrent(t *testing.T) {
	var nowNS atomic.Int64
	nowNS.Store(time.Unix(1000, 0).UnixNano())
	logs := &lockedBuf{}
	f, err := New(Config{Endpoints: twoEndpoints(), ProbeInterval: -1, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond,
		Now: func() time.Time { return time.Unix(0, nowNS.Load()) }}, slog.New(slog.NewTextHandler(logs, nil)), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 8 {
		wg.Go(func() {
			var buf []*Endpoint
			for {
				select {
				case <-stop:
					return
				default:
				}
				buf, _, _ = f.Healthy(buf[:0], "m")
			}
		})
	}
	for range 500 {
		for _, ep := range f.All() {
			f.Report(ep, OutcomeTimeout)
		}
		nowNS.Add(int64(2 * time.Millisecond)) // past the backoff: re-admitted by the next Healthy
	}
	close(stop)
	wg.Wait()
	f.Healthy(nil, "m")
	if g := testutil.ToFloat64(f.m.panic.WithLabelValues("m")); (g == 1) != f.Panic("m") {
		t.Errorf("gauge %v, state %v", g, f.Panic("m"))
	}
	on, off := strings.Count(logs.String(), "panic mode: too few"), strings.Count(logs.String(), "panic mode over")
	if d := on - off; d != 0 && d != 1 || (d == 1) != f.Panic("m") {
		t.Errorf("%d entering, %d leaving lines, state %v", on, off, f.Panic("m"))
	}
}
