package routing

import (
	"fmt"
	"sync/atomic"
	"time"
)

// Registerer receives a Router's Stats source so that a metrics system can
// read it at scrape time. routing imports no metrics library (it must not
// depend on net/http, which client_golang does); routingprom.Wrap adapts a
// prometheus.Registerer. A nil Registerer exports nothing.
type Registerer interface {
	RegisterRouter(policy string, stats func() Stats) error
}

// RouteSecondsBounds returns the upper bounds, in seconds, of the route
// duration histogram in Stats.RouteBuckets (1µs to 262ms, factor 4).
func RouteSecondsBounds() [10]float64 {
	return [10]float64{1e-6, 4e-6, 16e-6, 64e-6, 256e-6, 1.024e-3, 4.096e-3, 16.384e-3, 65.536e-3, 262.144e-3}
}

// Stats are a Router's counters since New, read without locks.
type Stats struct {
	Decisions      int64 // requests routed
	NoReplica      int64 // Route calls that found no eligible replica
	LeaseUnderflow int64 // releases that would have made a load counter negative
	PromptTokens   int64 // prompt tokens routed
	CachedTokens   int64 // of which in leading blocks the chosen replica held or had predicted
	// RouteBuckets counts route durations <= RouteSecondsBounds[i]
	// (cumulative as Prometheus histograms); RouteCount and RouteSeconds
	// are their count and sum.
	RouteBuckets [10]int64
	RouteCount   int64
	RouteSeconds float64
	// Replicas has one entry per registered replica, sorted by name.
	Replicas []ReplicaStats
}

// ReplicaStats are one replica's routing counters and current load.
type ReplicaStats struct {
	Name      string
	Decisions int64 // requests routed to it
	Load      Load
}

// metrics are the Router's atomics.
type metrics struct {
	decisions, noReplica, underflow, prompt, cached atomic.Int64
	buckets                                         [10]atomic.Int64
	count, nanos                                    atomic.Int64
}

func newMetrics(reg Registerer, policy string, stats func() Stats) (*metrics, error) {
	m := &metrics{}
	if reg != nil {
		if err := reg.RegisterRouter(policy, stats); err != nil {
			return nil, fmt.Errorf("routing: register metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) observe(t Terms, prompt int64, blockSize int, took time.Duration) {
	m.decisions.Add(1)
	m.cached.Add(min(prompt, int64(t.CachedBlocks*blockSize)))
	m.prompt.Add(prompt)
	s := took.Seconds()
	for i, b := range RouteSecondsBounds() {
		if s <= b {
			m.buckets[i].Add(1)
		}
	}
	m.count.Add(1)
	m.nanos.Add(int64(took))
}

func (m *metrics) stats() Stats {
	s := Stats{
		Decisions: m.decisions.Load(), NoReplica: m.noReplica.Load(), LeaseUnderflow: m.underflow.Load(),
		PromptTokens: m.prompt.Load(), CachedTokens: m.cached.Load(),
		RouteCount: m.count.Load(), RouteSeconds: time.Duration(m.nanos.Load()).Seconds(),
	}
	for i := range m.buckets {
		s.RouteBuckets[i] = m.buckets[i].Load()
	}
	return s
}
