package frontmetrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The shadow series are one family each with a front label: each front's
// observations land in its own series, and InitShadow creates a front's
// series at 0 without touching the other's.
func TestShadowByFront(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, err := New(reg)
	if err != nil {
		t.Fatal(err)
	}
	h, e := s.Front(HTTP), s.Front(EPP)
	h.InitShadow("s")
	e.InitShadow("s")
	h.ObserveShadow("s", true, 256)
	e.ObserveShadow("s", false, 0)
	e.ObserveShadow("s", false, 64)
	want := `
# HELP kvrouter_proxy_shadow_decisions_total Shadow mode: routing decisions by front (http, epp) and whether the shadow policy (kv) chose the replica the serving policy chose (agree=true|false).
# TYPE kvrouter_proxy_shadow_decisions_total counter
kvrouter_proxy_shadow_decisions_total{agree="false",front="epp",model="s"} 2
kvrouter_proxy_shadow_decisions_total{agree="false",front="http",model="s"} 0
kvrouter_proxy_shadow_decisions_total{agree="true",front="epp",model="s"} 0
kvrouter_proxy_shadow_decisions_total{agree="true",front="http",model="s"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kvrouter_proxy_shadow_decisions_total"); err != nil {
		t.Error(err)
	}
	hist := func(front string) (count uint64, sum float64) {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "kvrouter_proxy_shadow_cached_tokens" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "front" && l.GetValue() == front {
						return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
					}
				}
			}
		}
		t.Fatalf("no kvrouter_proxy_shadow_cached_tokens{front=%q}", front)
		return 0, 0
	}
	if n, sum := hist(HTTP); n != 1 || sum != 256 {
		t.Errorf("http: %d observations summing %v, want 1 of 256", n, sum)
	}
	if n, sum := hist(EPP); n != 2 || sum != 64 {
		t.Errorf("epp: %d observations summing %v, want 2 summing 64", n, sum)
	}
}
