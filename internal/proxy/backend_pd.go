package proxy

import "kvrouter/internal/routing"

// loadReporter is the optional part of a Router that tells a replica's
// current load (Backend does); disaggregated serving reads the prefill
// engine's queue and the decode engine's prefill rate from it. Without
// it the rule sees an empty queue and routing's default rates.
type loadReporter interface {
	load(name string) (routing.Load, bool)
}

var _ loadReporter = (*Backend)(nil)

// load implements loadReporter: the replica's load in the current
// generation's router.
func (b *Backend) load(name string) (routing.Load, bool) {
	return b.cur.Load().router.Load(name)
}
