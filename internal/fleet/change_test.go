package fleet

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/testwait"
)

// seriesOf returns the names of the metric families with a series labelled
// endpoint=name.
func seriesOf(t *testing.T, reg *prometheus.Registry, name string) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "endpoint" && l.GetValue() == name && !slices.Contains(out, mf.GetName()) {
					out = append(out, mf.GetName())
				}
			}
		}
	}
	return out
}

// Endpoints added and removed while Run runs: a new one is probed at once
// and routed; a removed one is routed no more, its loops stop, its series
// go and a late report does not bring them back; a model keeps existing
// with no endpoint.
func TestAddRemoveWhileRunning(t *testing.T) {
	fe := &fakeEngines{health: map[string]bool{"a:1": true, "c:1": true}, probes: map[string]int{}}
	f, reg := newTestFleet(t, Config{Models: []string{"m"}, Endpoints: twoEndpoints()[:1], ProbeInterval: 20 * time.Millisecond,
		ScrapeInterval: -1, ModelsInterval: -1, Client: &http.Client{Transport: fe}})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- f.Run(ctx) }()
	defer func() { cancel(); <-done }()

	c, err := f.Add(EndpointConfig{Name: "c", URL: "http://c:1", Models: []string{"m"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Add(EndpointConfig{Name: "c", URL: "http://c:2", Models: []string{"m"}}); err == nil {
		t.Fatal("a second endpoint named c: want error")
	}
	probes := func(host string) int { fe.mu.Lock(); defer fe.mu.Unlock(); return fe.probes[host+"/health"] }
	testwait.For(t, "a probe of the added endpoint", func() bool { return probes("c:1") > 0 && c.wasProbed() })
	if eps, _, err := f.Healthy(nil, "m"); err != nil || !slices.Equal(names(eps), []string{"a:1", "c"}) {
		t.Fatalf("healthy after Add: %v %v", names(eps), err)
	}
	if got := seriesOf(t, reg, "c"); len(got) < 5 {
		t.Fatalf("series of c after Add: %v", got)
	}

	if !f.Remove("c") || f.Remove("c") {
		t.Fatal("Remove: want true, then false")
	}
	if eps, _, _ := f.Healthy(nil, "m"); !slices.Equal(names(eps), []string{"a:1"}) || f.Endpoint("c") != nil {
		t.Fatalf("healthy after Remove: %v", names(eps))
	}
	f.Report(c, OutcomeConnError) // a request that was in flight on c ends
	if got := seriesOf(t, reg, "c"); len(got) != 0 {
		t.Fatalf("series of c after Remove and a late report: %v", got)
	}
	// Run stops c's loops once it sees the change: then five probe
	// intervals pass with at most the probe that was under way. (A fixed
	// 100 ms from Remove failed when Run's goroutine was slow to run.)
	for deadline := time.Now().Add(10 * time.Second); ; {
		n := probes("c:1")
		time.Sleep(100 * time.Millisecond) // five probe intervals
		m := probes("c:1")
		if m <= n+1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("c still probed 10 s after Remove (%d times in 100 ms)", m-n)
		}
	}

	if !f.Remove("a:1") {
		t.Fatal("Remove a:1")
	}
	if _, _, err := f.Healthy(nil, "m"); err == nil || !slices.Equal(f.Models(), []string{"m"}) {
		t.Fatalf("model without endpoints: healthy err %v, models %v", err, f.Models())
	}
}

// An endpoint its source does not admit gets no new requests, is not
// ready, and counts in no model's panic share.
func TestSetRoutable(t *testing.T) {
	f, reg := newTestFleet(t, Config{Endpoints: []EndpointConfig{
		{URL: "http://a:1", Models: []string{"m"}}, {URL: "http://b:1", Models: []string{"m"}}, {URL: "http://c:1", Models: []string{"m"}},
	}, ProbeInterval: -1})
	f.SetRoutable("b:1", false)
	f.SetRoutable("c:1", false)
	f.SetRoutable("nope", false)
	if eps, _, err := f.Healthy(nil, "m"); err != nil || !slices.Equal(names(eps), []string{"a:1"}) {
		t.Fatalf("healthy: %v %v", names(eps), err)
	}
	// One of three up would be panic; one of one admitted is not.
	if f.Panic("m") {
		t.Fatal("panic mode counted endpoints not admitted")
	}
	if st := f.States("m"); st[1].Admitted || st[1].Routable() || !st[0].Routable() {
		t.Fatalf("states: %+v", st)
	}
	out, _ := reg.Gather()
	var found bool
	for _, mf := range out {
		if mf.GetName() == "kvrouter_fleet_endpoint_admitted" {
			for _, m := range mf.GetMetric() {
				if strings.Contains(m.String(), `"b:1"`) && m.GetGauge().GetValue() == 0 {
					found = true
				}
			}
		}
	}
	if !found {
		t.Fatal("kvrouter_fleet_endpoint_admitted{endpoint=b:1} is not 0")
	}
	f.SetRoutable("a:1", false)
	if f.Ready() {
		t.Fatal("ready with no endpoint admitted")
	}
	f.SetRoutable("b:1", true)
	if eps, _, err := f.Healthy(nil, "m"); err != nil || !slices.Equal(names(eps), []string{"b:1"}) {
		t.Fatalf("healthy after re-admitting b: %v %v", names(eps), err)
	}
}
