package proxy

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"kvrouter/internal/fleet"
	"kvrouter/internal/group"
	"kvrouter/internal/routing"
)

// seriesOf counts the samples of metric name labelled replica=r.
func (rg *rig) seriesOf(name, r string) (n int, sum float64) {
	rg.t.Helper()
	mfs, err := rg.reg.Gather()
	if err != nil {
		rg.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "replica" && l.GetValue() == r {
					n++
					sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
				}
			}
		}
	}
	return n, sum
}

// A removed engine's per-replica series go once its last request has
// finished and been counted; a request in flight keeps them (its in-flight
// gauge returns to 0 first) and does not re-create them afterwards. An
// engine removed with nothing in flight loses them at once; one added
// again under the same name gets them back at 0.
func TestRemovedReplicaSeries(t *testing.T) {
	rg := newRig(t, 2)
	rg.router.pick = func(in *group.RouteInput) string { return "e1" }
	step := make(chan struct{})
	rg.engines[1].set(func(e *engine) { e.step = step })
	resp := rg.post("/v1/chat/completions", chatStream)
	<-rg.engines[1].started

	if !rg.fleet.Remove("e1") {
		t.Fatal("e1 not in the fleet")
	}
	rg.srv.ReplicaRemoved("e1")
	if n, v := rg.seriesOf("kvrouter_proxy_in_flight_requests", "e1"); n != 1 || v != 1 {
		t.Fatalf("in flight on removed e1: %d series, value %v; want 1 series at 1 while its request runs", n, v)
	}
	for range 3 {
		step <- struct{}{}
	}
	if body := readAll(t, resp); len(dataLines(body)) != 4 {
		t.Fatalf("stream on the removed engine did not finish whole:\n%s", body)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		nr, _ := rg.seriesOf("kvrouter_proxy_requests_total", "e1")
		ni, _ := rg.seriesOf("kvrouter_proxy_in_flight_requests", "e1")
		if nr == 0 && ni == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("removed e1 still has %d requests_total and %d in_flight series after its request finished", nr, ni)
		}
		time.Sleep(5 * time.Millisecond)
	}

	// Nothing in flight: gone at once; the other engine keeps its series.
	if !rg.fleet.Remove("e0") {
		t.Fatal("e0 not in the fleet")
	}
	rg.srv.ReplicaRemoved("e0")
	if n, _ := rg.seriesOf("kvrouter_proxy_requests_total", "e0"); n != 0 {
		t.Fatalf("idle removed e0 keeps %d requests_total series", n)
	}
	// Added again: the series exist from the start, at 0.
	for _, e := range rg.engines {
		if _, err := rg.fleet.Add(fleet.EndpointConfig{Name: e.name, URL: e.srv.URL, Models: []string{"m"}}); err != nil {
			t.Fatal(err)
		}
		rg.srv.ReplicaAdded("m", e.name)
		rg.srv.ReplicaRemoved(e.name) // a stale removal of the old one keeps the new one's series
		if n, v := rg.seriesOf("kvrouter_proxy_requests_total", e.name); n != 7 || v != 0 {
			t.Fatalf("re-added %s: %d requests_total series summing %v, want 7 at 0", e.name, n, v)
		}
		if n, v := rg.seriesOf("kvrouter_proxy_in_flight_requests", e.name); n != 1 || v != 0 {
			t.Fatalf("re-added %s: %d in_flight series at %v, want 1 at 0", e.name, n, v)
		}
	}
}

// An engine removed between the healthy list and the routing decision
// (a reload or discovery change under traffic): the request is routed
// again among the engines left instead of failing, and it is not
// counted as a retry; the same when the router has already forgotten
// every candidate (routing.ErrNoReplica).
func TestRemovedWhileRouting(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first func(rg *rig) (string, error)
	}{
		{"chosen endpoint gone", func(rg *rig) (string, error) {
			rg.fleet.Remove("e1") // after Healthy listed it
			return "e1", nil
		}},
		{"router knows no candidate", func(rg *rig) (string, error) {
			rg.fleet.Remove("e1")
			return "", fmt.Errorf("model %q: %w", "m", routing.ErrNoReplica)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rg := newRig(t, 2)
			var calls atomic.Int32
			rg.router.route = func(in *group.RouteInput) (string, error) {
				if calls.Add(1) == 1 {
					return tc.first(rg)
				}
				return in.Candidates[0], nil
			}
			resp := rg.post("/v1/chat/completions", chatBody)
			body := readAll(t, resp)
			if resp.StatusCode != 200 || resp.Header.Get("X-Kvrouter-Replica") != "e0" {
				t.Fatalf("%d from %q: %s", resp.StatusCode, resp.Header.Get("X-Kvrouter-Replica"), body)
			}
			if got := rg.engines[1].requests.Load(); got != 0 {
				t.Errorf("removed e1 got %d requests", got)
			}
			if v := testutil.ToFloat64(rg.srv.m.retries.WithLabelValues("m", "conn_error")); v != 0 {
				t.Errorf("counted as a retry: %v", v)
			}
		})
	}
}
