package discovery

import "github.com/prometheus/client_golang/prometheus"

// metrics are one Source's collectors, labelled source=config.Discovery.Name.
type metrics struct {
	snapshots   prometheus.Counter
	engines     *prometheus.GaugeVec
	lists       prometheus.Counter
	watchErrors prometheus.Counter
	badAnn      prometheus.Counter
	// secretErrors counts failed reads of API-key Secrets.
	secretErrors prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, source string) (*metrics, error) {
	cl := prometheus.Labels{"source": source}
	m := &metrics{
		snapshots: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvrouter_discovery_snapshots_total", ConstLabels: cl,
			Help: "Changed snapshots of the engine set sent to the consumer.",
		}),
		engines: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvrouter_discovery_engines", ConstLabels: cl,
			Help: "Engines in the last snapshot, by state (ready, draining, not_ready).",
		}, []string{"state"}),
		lists: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvrouter_discovery_lists_total", ConstLabels: cl,
			Help: "Full lists answered by the API server (the first, and re-lists when a watch could not resume), summed over the informers.",
		}),
		watchErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvrouter_discovery_watch_errors_total", ConstLabels: cl,
			Help: "Informer lists (or watches) that could not start, e.g. API server unreachable or forbidden; each is retried with backoff. A watch that ends and resumes or re-lists is not counted.",
		}),
		badAnn: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvrouter_discovery_bad_annotations_total", ConstLabels: cl,
			Help: "Distinct Pod annotation values that did not parse (the default was used).",
		}),
		secretErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvrouter_discovery_secret_errors_total", ConstLabels: cl,
			Help: "Reads of engines' API-key Secrets that failed (missing Secret or key, empty value, forbidden, API server unreachable); the key read before is kept, an engine without one is left out.",
		}),
	}
	for _, s := range []State{StateReady, StateDraining, StateNotReady} {
		m.engines.WithLabelValues(s.String())
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.snapshots, m.engines, m.lists, m.watchErrors, m.badAnn, m.secretErrors} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
