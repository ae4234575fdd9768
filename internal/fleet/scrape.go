package fleet

import (
	"context"
	"io"
	"slices"

	"kvrouter/internal/vllm/enginemetrics"
)

// scrape reads ep's /metrics, notes for stall detection whether the engine
// shows progress, and hands the parsed vllm: figures to Config.OnMetrics. A monotonic counter lower than at the previous scrape
// means the engine process restarted (vLLM's counters start at 0): that is
// logged, counted and handed to Config.OnRestart before OnMetrics.
func (f *Fleet) scrape(ctx context.Context, ep *Endpoint) {
	var m enginemetrics.Metrics
	err := f.get(ctx, ep, "/metrics", func(r io.Reader) error {
		var err error
		m, err = enginemetrics.Parse(r)
		return err
	})
	if err != nil {
		f.withMetrics(ep, func(m *metrics) { m.scrapes.WithLabelValues(ep.name, "error").Inc() })
		f.log.Debug("scrape failed", "endpoint", ep.name, "err", err)
		return
	}
	ep.scraped(f.cfg.Now(), m) // a sign of life if it shows progress (stall.go)
	f.withMetrics(ep, func(m *metrics) { m.scrapes.WithLabelValues(ep.name, "ok").Inc() })
	if name, from, to, ok := ep.restarted(m); ok {
		f.withMetrics(ep, func(m *metrics) { m.restarts.WithLabelValues(ep.name).Inc() })
		f.log.Warn("engine restarted (a counter went backwards); dropping its cached blocks", "endpoint", ep.name, "counter", name, "from", from, "to", to)
		if f.cfg.OnRestart != nil {
			f.cfg.OnRestart(ep)
		}
	}
	if m.LoRA != nil {
		ep.lora.Store(m.LoRA) // loraslots.go
	}
	if f.cfg.OnMetrics != nil {
		f.cfg.OnMetrics(ep, m)
	}
}

// restarted records m's monotonic counters (the ones present) and reports
// the first that is lower than at the previous scrape that had it, with its
// two values. A counter absent from one scrape keeps its last value.
func (e *Endpoint) restarted(m enginemetrics.Metrics) (name string, from, to float64, ok bool) {
	cur := [...]struct {
		name string
		v    float64
	}{
		{"vllm:prefix_cache_queries_total", m.PrefixCacheQueries},
		{"vllm:prefix_cache_hits_total", m.PrefixCacheHits},
		{"vllm:num_preemptions_total", m.Preemptions},
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.counters == nil {
		e.counters = make(map[string]float64, len(cur))
	}
	for _, c := range cur {
		if slices.Contains(m.Missing, c.name) {
			continue
		}
		if last, seen := e.counters[c.name]; seen && c.v < last && !ok {
			name, from, to, ok = c.name, last, c.v, true
		}
		e.counters[c.name] = c.v
	}
	return name, from, to, ok
}
