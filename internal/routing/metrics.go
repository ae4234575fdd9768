package routing

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the Router's collectors (kvrouter_routing_*).
type metrics struct {
	reg       prometheus.Registerer
	decisions *prometheus.CounterVec
	cached    prometheus.Counter
	prompt    prometheus.Counter
	duration  prometheus.Histogram
	underflow prometheus.Counter
	noReplica prometheus.Counter
}

// newMetrics registers the Router's metrics on reg (nil: unregistered).
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		reg: reg,
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_routing_decisions_total",
			Help: "Routing decisions by chosen replica and reason.",
		}, []string{"replica", "reason"}),
		cached: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvrouter_routing_cached_tokens_total",
			Help: "Prompt tokens in leading blocks the chosen replica held or had predicted.",
		}),
		prompt: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvrouter_routing_prompt_tokens_total",
			Help: "Prompt tokens routed.",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvrouter_routing_route_duration_seconds",
			Help:    "Time to choose a replica: hashing, lookup and policy.",
			Buckets: prometheus.ExponentialBuckets(1e-6, 4, 10),
		}),
		underflow: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvrouter_routing_lease_underflow_total",
			Help: "Load releases that would have made a counter negative (accounting bugs).",
		}),
		noReplica: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvrouter_routing_no_replica_total",
			Help: "Requests for which no healthy replica was available.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.decisions, m.cached, m.prompt, m.duration, m.underflow, m.noReplica} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("routing: register metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) observe(d *Decision, replica string, t Terms, prompt int64, blockSize int, took time.Duration) {
	m.decisions.WithLabelValues(replica, d.Reason).Inc()
	m.cached.Add(float64(min(prompt, int64(t.CachedBlocks*blockSize))))
	m.prompt.Add(float64(prompt))
	m.duration.Observe(took.Seconds())
}

// deleteReplica drops a departed replica's label values.
func (m *metrics) deleteReplica(name string) {
	m.decisions.DeletePartialMatch(prometheus.Labels{"replica": name})
}
