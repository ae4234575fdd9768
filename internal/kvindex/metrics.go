package kvindex

import "fmt"

// Registerer receives an index's Stats source so that a metrics system can
// read it at scrape time. kvindex imports no metrics library (it must not
// depend on net/http, which client_golang does); kvindexprom.Wrap adapts a
// prometheus.Registerer. A nil Registerer exports nothing.
type Registerer interface {
	// RegisterIndex registers one index: kind is "exact" or "approx", cfg
	// names its key space, stats returns its counters (lock-free).
	RegisterIndex(kind string, cfg Config, stats func() Stats) error
}

func newMetrics(reg Registerer, kind string, cfg Config, stats func() Stats) error {
	if reg == nil {
		return nil
	}
	if err := reg.RegisterIndex(kind, cfg, stats); err != nil {
		return fmt.Errorf("kvindex: register metrics: %w", err)
	}
	return nil
}
