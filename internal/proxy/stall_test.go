package proxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"kvrouter/internal/config"
	"kvrouter/internal/fleet"

	dto "github.com/prometheus/client_model/go"

	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/testwait"
)

// gathered returns the value of the counter or gauge name with labels
// (name=value pairs) in reg, or -1 when there is none.
func gathered(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool {
					return l.GetName() == labels[i] && l.GetValue() == labels[i+1]
				}) {
					continue next
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

// healthyNames lists the endpoints the fleet would route model m to now.
func healthyNames(fl *fleet.Fleet) []string {
	eps, _, _ := fl.Healthy(nil, "m")
	var out []string
	for _, ep := range eps {
		out = append(out, ep.Name())
	}
	return out
}

// TestStalledEngineSkipped: engine e0 stops answering anything (a stopped
// process: connections accepted, no byte back, /health included) while a
// request waits on it. Within StallAfter (1s, the default) plus the check
// period the fleet holds it out: new requests go to e1, and the stall is
// counted and e0's endpoint_up is 0. When e0 answers again (the waiting
// request gets its answer) it is routed again at once.
func TestStalledEngineSkipped(t *testing.T) {
	rg := newRig(t, 2, func(_ *config.Config, f *fleet.Config) { f.ModelsInterval = -1 })
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- rg.fleet.Run(ctx) }()
	defer func() {
		cancel()
		<-runDone
	}()

	frozen := make(chan struct{})
	var unfreeze sync.Once
	t.Cleanup(func() { unfreeze.Do(func() { close(frozen) }) }) // before the rig's: its servers wait for their requests
	rg.engines[0].set(func(e *engine) { e.frozen = frozen })
	waited := make(chan string, 1)
	sent := time.Now()
	go func() { // the first candidate, e0, gets it and holds it
		resp := rg.post("/v1/completions", `{"model":"m","prompt":"hi"}`)
		readAll(t, resp)
		waited <- resp.Header.Get("X-Kvrouter-Replica")
	}()
	var last []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if last = healthyNames(rg.fleet); !slices.Contains(last, "e0") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("e0 still routed 10s after it stopped answering; healthy %v", last)
		}
	}
	took := time.Since(sent)
	t.Logf("e0 held out %v after the request was sent", took)
	if took < time.Second {
		t.Errorf("e0 held out after %v, before StallAfter (1s)", took)
	}
	if !slices.Equal(last, []string{"e1"}) {
		t.Fatalf("healthy %v, want [e1]", last)
	}
	resp := rg.post("/v1/completions", `{"model":"m","prompt":"hi"}`)
	if body := readAll(t, resp); resp.StatusCode != 200 || resp.Header.Get("X-Kvrouter-Replica") != "e1" {
		t.Fatalf("new request: %d from %q (%s), want 200 from e1", resp.StatusCode, resp.Header.Get("X-Kvrouter-Replica"), body)
	}
	if got := gathered(t, rg.reg, "kvrouter_fleet_ejections_total", "endpoint", "e0", "reason", "stall"); got != 1 {
		t.Errorf("kvrouter_fleet_ejections_total{endpoint=e0,reason=stall} = %v, want 1", got)
	}
	if !rg.fleet.Endpoint("e0").Stalled() || gathered(t, rg.reg, "kvrouter_fleet_endpoint_up", "endpoint", "e0") != 0 {
		t.Errorf("e0: Stalled() %v, endpoint_up %v; want true, 0", rg.fleet.Endpoint("e0").Stalled(), gathered(t, rg.reg, "kvrouter_fleet_endpoint_up", "endpoint", "e0"))
	}

	unfreeze.Do(func() { close(frozen) }) // e0 answers the waiting request: a sign of life
	if got := <-waited; got != "e0" {
		t.Fatalf("the held request was answered by %q, want e0", got)
	}
	testwait.For(t, "e0 routed again", func() bool { return slices.Contains(healthyNames(rg.fleet), "e0") })
	if up := gathered(t, rg.reg, "kvrouter_fleet_endpoint_up", "endpoint", "e0"); up != 1 {
		t.Errorf("e0 endpoint_up %v after recovery, want 1", up)
	}
	if got := gathered(t, rg.reg, "kvrouter_fleet_ejections_total", "endpoint", "e0", "reason", "stall"); got != 1 {
		t.Errorf("stall ejections after recovery = %v, want 1", got)
	}
}

// newHungCore serves as a vLLM engine whose core hangs (a stuck GPU step)
// while its API server lives: /health answers 200, /metrics answers with
// counters that never move, a stream gets its headers (and a Responses
// stream its opening events) but no output, until the test ends.
func newHungCore(t *testing.T) string {
	t.Helper()
	done := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			return
		case "/metrics":
			io.WriteString(w, "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3\n"+
				"vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 1\n"+
				"vllm:prompt_tokens_total{engine=\"0\",model_name=\"m\"} 12345\n"+
				"vllm:generation_tokens_total{engine=\"0\",model_name=\"m\"} 678\n")
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		if r.URL.Path == responsesPath {
			io.WriteString(w, "event: response.created\ndata: {\"type\":\"response.created\"}\n\n"+
				"event: response.in_progress\ndata: {\"type\":\"response.in_progress\"}\n\n")
		}
		_ = http.NewResponseController(w).Flush()
		select {
		case <-r.Context().Done():
		case <-done:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(done) }) // before srv.Close: its handlers return
	return srv.URL
}

// TestHungCoreSkipped: e0 is a vLLM engine whose core hangs while its API
// server answers /health, /metrics (frozen counters) and a stream's
// headers (and a Responses stream's opening events) at once. None of
// those is a sign of life: once the request waiting there is overdue
// (StallAfter, 1s), e0 is held out and new requests go to e1. Before,
// the headers ended the wait and the probes and scrapes counted as life.
func TestHungCoreSkipped(t *testing.T) {
	for _, tc := range []struct{ name, path, body string }{
		{"completions", "/v1/completions", `{"model":"m","prompt":"hi","stream":true}`},
		{"responses", responsesPath, `{"model":"m","input":"hi","stream":true}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hung := newHungCore(t)
			rg := newRig(t, 2, func(c *config.Config, f *fleet.Config) {
				c.Models[0].Engines[0].URL = hung
				f.Endpoints[0].URL = hung
				f.ModelsInterval, f.ProbeInterval, f.ScrapeInterval = -1, 50*time.Millisecond, 100*time.Millisecond
			})
			ctx, cancel := context.WithCancel(context.Background())
			runDone := make(chan error, 1)
			go func() { runDone <- rg.fleet.Run(ctx) }()
			defer func() {
				cancel()
				<-runDone
			}()
			// Before the request: the router's wait starts after this, so
			// a hold-out sooner than StallAfter after it is too early.
			sent := time.Now()
			resp := rg.postCtx(ctx, tc.path, tc.body) // to e0, the first candidate: headers only
			defer resp.Body.Close()
			if got := resp.Header.Get("X-Kvrouter-Replica"); got != "e0" {
				t.Fatalf("first request to %q, want e0", got)
			}
			testwait.Within(t, 10*time.Second, "e0 held out as stalled", func() bool {
				return !slices.Contains(healthyNames(rg.fleet), "e0")
			})
			took := time.Since(sent)
			t.Logf("e0 held out %v after the request was sent", took)
			if took < time.Second {
				t.Errorf("held out after %v, before StallAfter (1s)", took)
			}
			if got := gathered(t, rg.reg, "kvrouter_fleet_probes_total", "endpoint", "e0", "result", "ok"); got < 1 {
				t.Errorf("e0's probes answered %v, want some: they must not keep it in", got)
			}
			next := rg.post("/v1/completions", `{"model":"m","prompt":"hi"}`)
			if body := readAll(t, next); next.StatusCode != 200 || next.Header.Get("X-Kvrouter-Replica") != "e1" {
				t.Fatalf("new request: %d from %q (%s), want 200 from e1", next.StatusCode, next.Header.Get("X-Kvrouter-Replica"), body)
			}
		})
	}
}
