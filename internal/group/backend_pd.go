package group

import "kvrouter/internal/routing"

// Load returns replica's current load in the current generation's router
// (routing.Router.Load; ok false for a name the router does not know).
// Disaggregated serving reads the prefill engine's queue and the decode
// engine's prefill rate from it.
func (b *Backend) Load(replica string) (routing.Load, bool) {
	return b.cur.Load().router.Load(replica)
}
