// Package kvindexprom exports kvindex Stats as Prometheus metrics
// (kvrouter_kvindex_*), read at scrape time. It is separate from kvindex so
// that kvindex does not depend on client_golang (which imports net/http).
package kvindexprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/kvindex"
)

// Wrap returns a kvindex.Registerer that registers each index's collector on
// reg, with const labels model, pool and index ("exact" or "approx"), so that
// several indexes share one registry.
func Wrap(reg prometheus.Registerer) kvindex.Registerer { return wrapped{reg} }

type wrapped struct{ reg prometheus.Registerer }

// collector exports an index's Stats at scrape time. Const labels model,
// pool and index (exact or approx) let several indexes share a registry.
type collector struct {
	stats func() kvindex.Stats
	descs []*prometheus.Desc
}

type statMetric struct {
	name, help string
	gauge      bool
	value      func(kvindex.Stats) float64
}

var statMetrics = []statMetric{
	{"entries", "Current (block, engine rank) entries.", true, func(s kvindex.Stats) float64 { return float64(s.Entries) }},
	{"keys", "Current distinct block keys.", true, func(s kvindex.Stats) float64 { return float64(s.Keys) }},
	{"replicas", "Replicas registered.", true, func(s kvindex.Stats) float64 { return float64(s.Replicas) }},
	{"bytes", "Memory held by the index tables, in bytes.", true, func(s kvindex.Stats) float64 { return float64(s.Bytes) }},
	{"batches_total", "KV event batches applied.", false, func(s kvindex.Stats) float64 { return float64(s.Batches) }},
	{"blocks_stored_total", "Blocks newly stored (entries created).", false, func(s kvindex.Stats) float64 { return float64(s.Stored) }},
	{"blocks_duplicate_total", "Extra copies of blocks already held.", false, func(s kvindex.Stats) float64 { return float64(s.Duplicates) }},
	{"blocks_hit_reports_total", "Blocks refreshed by hit reports.", false, func(s kvindex.Stats) float64 { return float64(s.HitReports) }},
	{"blocks_removed_total", "Blocks removed (entries deleted).", false, func(s kvindex.Stats) float64 { return float64(s.Removed) }},
	{"blocks_cleared_total", "Entries dropped by AllBlocksCleared, engine reset or replica removal.", false, func(s kvindex.Stats) float64 { return float64(s.Cleared) }},
	{"blocks_evicted_total", "Entries evicted by the entry cap, capacity or TTL.", false, func(s kvindex.Stats) float64 { return float64(s.Evicted) }},
	{"unknown_parent_total", "BlockStored events skipped because the parent hash was never stored.", false, func(s kvindex.Stats) float64 { return float64(s.UnknownParent) }},
	{"unknown_removed_total", "BlockRemoved hashes not in the index.", false, func(s kvindex.Stats) float64 { return float64(s.UnknownRemoved) }},
	{"mismatched_total", "BlockStored events skipped: block size, token count or extra keys inconsistent.", false, func(s kvindex.Stats) float64 { return float64(s.Mismatched) }},
	{"other_groups_total", "BlockStored events skipped: not a full-attention KV group.", false, func(s kvindex.Stats) float64 { return float64(s.OtherGroups) }},
	{"predicted_total", "Predicted (block, replica) pairs created.", false, func(s kvindex.Stats) float64 { return float64(s.Predicted) }},
	{"predicted_confirmed_total", "Predictions confirmed by a BlockStored of the chosen replica.", false, func(s kvindex.Stats) float64 { return float64(s.Confirmed) }},
	{"predicted_expired_total", "Predictions expired or evicted unconfirmed.", false, func(s kvindex.Stats) float64 { return float64(s.Expired) }},
	{"predicted_cancelled_total", "Predictions dropped because the engine answered the request with an error.", false, func(s kvindex.Stats) float64 { return float64(s.Cancelled) }},
	{"predicted", "Predictions currently held.", true, func(s kvindex.Stats) float64 { return float64(s.PredictedLive) }},
	{"predicted_confirmation_ratio", "Confirmed / (confirmed + expired) predictions; low means the router's tokens differ from the engine's.", true, func(s kvindex.Stats) float64 { return s.ConfirmationRate() }},
}

func (w wrapped) RegisterIndex(kind string, cfg kvindex.Config, stats func() kvindex.Stats) error {
	reg := w.reg
	labels := prometheus.Labels{"model": cfg.Model, "pool": cfg.Pool, "index": kind}
	c := &collector{stats: stats}
	for _, m := range statMetrics {
		c.descs = append(c.descs, prometheus.NewDesc("kvrouter_kvindex_"+m.name, m.help, nil, labels))
	}
	return reg.Register(c)
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	for i, m := range statMetrics {
		t := prometheus.CounterValue
		if m.gauge {
			t = prometheus.GaugeValue
		}
		ch <- prometheus.MustNewConstMetric(c.descs[i], t, m.value(s))
	}
}
