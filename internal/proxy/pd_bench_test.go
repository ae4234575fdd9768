package proxy

import (
	"fmt"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/admission"
	"kvrouter/internal/config"
	"kvrouter/internal/fleet"
	"kvrouter/internal/group"
	"kvrouter/internal/request"
)

// BenchmarkPDPlan measures the routing work P/D adds per request: planPD
// (dry runs of the kv policy over the decode pool and the prefill pool,
// the rule) against one dry run over all replicas (what an aggregated
// request's decision costs), on the approximate index with 4 + 4 engines
// each holding a different 8K-token prompt, for a 16K-token prompt that
// shares 8K tokens with one of them.
//
//	go test -run '^$' -bench BenchmarkPDPlan -benchmem -count 6 ./internal/proxy/
func BenchmarkPDPlan(b *testing.B) {
	mc := config.Model{Name: "m", Tokenizer: config.TokenizerNone}
	fcfg := fleet.Config{ProbeInterval: -1, ScrapeInterval: -1}
	var names, prefill, decode []string
	for i := range 8 {
		name, role := fmt.Sprintf("e%d", i), config.RolePrefill
		if i >= 4 {
			role = config.RoleDecode
		}
		url := fmt.Sprintf("http://127.0.0.1:%d", 10000+i)
		mc.Engines = append(mc.Engines, config.Engine{Name: name, URL: url, Role: role})
		fcfg.Endpoints = append(fcfg.Endpoints, fleet.EndpointConfig{Name: name, URL: url, Models: []string{"m"}})
		names = append(names, name)
		if role == config.RolePrefill {
			prefill = append(prefill, name)
		} else {
			decode = append(decode, name)
		}
	}
	cfg := config.Config{Models: []config.Model{mc}}
	cfg.FillDefaults(func(string) string { return "" })
	if err := cfg.Validate(); err != nil {
		b.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	fl, err := fleet.New(fcfg, nil, reg)
	if err != nil {
		b.Fatal(err)
	}
	be, err := group.NewBackend(group.BackendConfig{Model: "m", Replicas: names}, nil, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	srv, err := New(cfg, Deps{Fleet: fl, Routers: map[string]group.Router{"m": be}}, nil, reg)
	if err != nil {
		b.Fatal(err)
	}
	prompt := func(base int) []uint32 {
		t := make([]uint32, 8192)
		for i := range t {
			t[i] = uint32(base + i)
		}
		return t
	}
	for i, n := range names { // each engine holds one 8K prompt (approximate index: a routed decision)
		d, err := be.Route(&group.RouteInput{Model: "m", Tokens: prompt(i * 100000), Candidates: []string{n}})
		if err != nil {
			b.Fatal(err)
		}
		d.Release()
	}
	r := httptest.NewRequest("POST", "/v1/completions", nil)
	x := &exchange{r: r, m: srv.models["m"], Flow: admission.Flow{Ctx: r.Context(), Header: r.Header.Get, Req: &request.Parsed{Model: "m"}, Group: srv.models["m"].Group,
		Tokens: append(prompt(0), prompt(900000)...)}}
	x.hooks = newHooks(x)
	b.Run("pd_plan", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := srv.planPD(x, prefill, decode); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("aggregated_dry_run", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := srv.dryRoute(x, names); err != nil {
				b.Fatal(err)
			}
		}
	})
}
