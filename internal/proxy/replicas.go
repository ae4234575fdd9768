package proxy

import "slices"

// An engine removed from the fleet loses its front="http" series
// (kvrouter_proxy_requests_total{replica},
// kvrouter_proxy_in_flight_requests{replica}) once the last exchange that
// may write them has finished and been counted (frontmetrics.Holds, the
// same mechanism as the EPP's); the other fronts' hooks
// (Picker.OnReplicaRemoved) delete theirs.

// ReplicaAdded creates the series of an engine added to model's group
// while serving, at 0 (as New does for the engines present at start).
func (s *Server) ReplicaAdded(model, replica string) {
	s.holds.Locked(func() {
		s.m.inFlight.WithLabelValues(replica).Add(0)
		s.m.initReplica(model, replica)
		s.trust.init(replica)
	})
}

// ReplicaRemoved deletes the series of an engine removed from the fleet
// (call after fleet.Fleet.Remove): at once when no request holds them,
// else when the last request on it has finished and been counted. An
// engine added again under the same name keeps its series.
// The other fronts' hooks (Picker.OnReplicaRemoved) are called after, for
// theirs.
func (s *Server) ReplicaRemoved(replica string) {
	s.holds.Removed(replica)
	s.removedMu.Lock()
	hooks := slices.Clone(s.removed)
	s.removedMu.Unlock()
	for _, f := range hooks {
		f(replica)
	}
}

// OnReplicaRemoved registers f, called with the name of each engine
// removed from the fleet while serving (Server.ReplicaRemoved), for
// another front to delete its series of it; f must not block.
func (p *Picker) OnReplicaRemoved(f func(replica string)) {
	p.s.removedMu.Lock()
	defer p.s.removedMu.Unlock()
	p.s.removed = append(p.s.removed, f)
}

// HasReplica reports whether the fleet has an engine named replica (still
// there, or added again under that name).
func (p *Picker) HasReplica(replica string) bool { return p.s.deps.Fleet.Endpoint(replica) != nil }
