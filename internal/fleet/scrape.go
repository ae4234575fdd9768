package fleet

import (
	"context"
	"io"

	"kvrouter/internal/vllm/enginemetrics"
)

// scrape reads ep's /metrics and hands the parsed vllm: figures to
// Config.OnMetrics.
func (f *Fleet) scrape(ctx context.Context, ep *Endpoint) {
	var m enginemetrics.Metrics
	err := f.get(ctx, ep, "/metrics", func(r io.Reader) error {
		var err error
		m, err = enginemetrics.Parse(r)
		return err
	})
	if err != nil {
		f.m.scrapes.WithLabelValues(ep.name, "error").Inc()
		f.log.Debug("scrape failed", "endpoint", ep.name, "err", err)
		return
	}
	f.m.scrapes.WithLabelValues(ep.name, "ok").Inc()
	if f.cfg.OnMetrics != nil {
		f.cfg.OnMetrics(ep, m)
	}
}
