package pool

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are a pool's collectors, labelled with its model.
type metrics struct {
	engines      prometheus.Gauge
	changes      *prometheus.CounterVec
	partFailures *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, model string) (*metrics, error) {
	l := prometheus.Labels{"model": model}
	m := &metrics{
		engines: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvrouter_pool_engines", Help: "Engines in the model group's pool (routable or not).", ConstLabels: l,
		}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_pool_changes_total", Help: "Engines added to or removed from the model group's pool, by change (added, removed).", ConstLabels: l,
		}, []string{"change"}),
		partFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_pool_part_failures_total", Help: "Engine parts (kv events, tokenizer probe) that stopped with an error while the engine stayed in the pool.", ConstLabels: l,
		}, []string{"part"}),
	}
	m.changes.WithLabelValues("added")
	m.changes.WithLabelValues("removed")
	for _, part := range []string{"kv events", "tokenizer"} { // serve's parts: 0, not "no data"
		m.partFailures.WithLabelValues(part)
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.engines, m.changes, m.partFailures} {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	return m, errors.Join(errs...)
}
