package fleet

import "context"

// scrape reads ep's /metrics.
func (f *Fleet) scrape(ctx context.Context, ep *Endpoint) {
	err := f.get(ctx, ep, "/metrics", nil)
	result := "ok"
	if err != nil {
		result = "error"
	}
	f.m.scrapes.WithLabelValues(ep.name, result).Inc()
}
