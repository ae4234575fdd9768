// Package routingprom exports routing.Router Stats as Prometheus metrics
// (kvrouter_routing_*), read at scrape time. It is separate from routing so
// that routing does not depend on client_golang (which imports net/http).
package routingprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/routing"
)

// Wrap returns a routing.Registerer that registers each Router's collector
// on reg with the const label policy.
func Wrap(reg prometheus.Registerer) routing.Registerer { return wrapped{reg} }

type wrapped struct{ reg prometheus.Registerer }

// RegisterRouter implements routing.Registerer.
func (w wrapped) RegisterRouter(policy string, stats func() routing.Stats) error {
	l := prometheus.Labels{"policy": policy}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("kvrouter_routing_"+name, help, labels, l)
	}
	return w.reg.Register(&collector{
		stats:       stats,
		decisions:   d("decisions_total", "Requests routed, by chosen replica.", "replica"),
		inFlight:    d("in_flight_requests", "Requests routed and not yet released, by replica.", "replica"),
		queued:      d("queued_prefill_tokens", "Uncached prompt tokens of requests before their first token, by replica.", "replica"),
		decode:      d("running_decode_tokens", "Expected output tokens of requests past their first token, by replica.", "replica"),
		prefillRate: d("prefill_rate_tokens_per_second", "Prefill throughput the cost function uses, by replica: configured, set, or learned from the engine (learn_rates).", "replica"),
		decodeRate:  d("decode_rate_tokens_per_second", "Decode throughput the cost function uses, by replica: configured, set, or learned from the engine (learn_rates).", "replica"),
		noReplica:   d("no_replica_total", "Route calls that found no eligible replica."),
		underflow:   d("lease_underflow_total", "Load releases that would have made a counter negative (accounting bugs)."),
		prompt:      d("prompt_tokens_total", "Prompt tokens routed."),
		cached:      d("cached_tokens_total", "Prompt tokens in leading blocks the chosen replica held or had predicted."),
		duration:    d("route_duration_seconds", "Time to choose a replica: hashing, lookup, policy."),
	})
}

type collector struct {
	stats                                          func() routing.Stats
	decisions, inFlight, queued, decode            *prometheus.Desc
	prefillRate, decodeRate                        *prometheus.Desc
	noReplica, underflow, prompt, cached, duration *prometheus.Desc
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.decisions, c.inFlight, c.queued, c.decode, c.prefillRate, c.decodeRate, c.noReplica, c.underflow, c.prompt, c.cached, c.duration} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. Departed replicas disappear with
// the Router's replica set.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	for _, r := range s.Replicas {
		ch <- prometheus.MustNewConstMetric(c.decisions, prometheus.CounterValue, float64(r.Decisions), r.Name)
		ch <- prometheus.MustNewConstMetric(c.inFlight, prometheus.GaugeValue, float64(r.Load.InFlight), r.Name)
		ch <- prometheus.MustNewConstMetric(c.queued, prometheus.GaugeValue, float64(r.Load.QueuedPrefill), r.Name)
		ch <- prometheus.MustNewConstMetric(c.decode, prometheus.GaugeValue, float64(r.Load.RunningDecode), r.Name)
		ch <- prometheus.MustNewConstMetric(c.prefillRate, prometheus.GaugeValue, r.Load.PrefillRate, r.Name)
		ch <- prometheus.MustNewConstMetric(c.decodeRate, prometheus.GaugeValue, r.Load.DecodeRate, r.Name)
	}
	ch <- prometheus.MustNewConstMetric(c.noReplica, prometheus.CounterValue, float64(s.NoReplica))
	ch <- prometheus.MustNewConstMetric(c.underflow, prometheus.CounterValue, float64(s.LeaseUnderflow))
	ch <- prometheus.MustNewConstMetric(c.prompt, prometheus.CounterValue, float64(s.PromptTokens))
	ch <- prometheus.MustNewConstMetric(c.cached, prometheus.CounterValue, float64(s.CachedTokens))
	buckets := map[float64]uint64{}
	for i, b := range routing.RouteSecondsBounds() {
		buckets[b] = uint64(s.RouteBuckets[i])
	}
	ch <- prometheus.MustNewConstHistogram(c.duration, uint64(s.RouteCount), s.RouteSeconds, buckets)
}
