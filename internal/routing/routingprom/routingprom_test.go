package routingprom

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"kvrouter/internal/routing"
)

func TestCollector(t *testing.T) {
	reg := prometheus.NewRegistry()
	r, err := routing.New(routing.Config{Policy: "least_load"}, nil, nil, Wrap(reg))
	if err != nil {
		t.Fatal(err)
	}
	r.AddReplica("a")
	_, l, err := r.Route(&routing.Request{Tokens: make([]uint32, 40)})
	if err != nil {
		t.Fatal(err)
	}
	want := `
# HELP kvrouter_routing_decisions_total Requests routed, by chosen replica.
# TYPE kvrouter_routing_decisions_total counter
kvrouter_routing_decisions_total{policy="least_load",replica="a"} 1
# HELP kvrouter_routing_in_flight_requests Requests routed and not yet released, by replica.
# TYPE kvrouter_routing_in_flight_requests gauge
kvrouter_routing_in_flight_requests{policy="least_load",replica="a"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kvrouter_routing_decisions_total", "kvrouter_routing_in_flight_requests"); err != nil {
		t.Fatal(err)
	}
	l.Release()
	if n, err := testutil.GatherAndCount(reg, "kvrouter_routing_route_duration_seconds"); err != nil || n != 1 {
		t.Fatalf("histogram: %d %v", n, err)
	}
}
