package proxy

import (
	"kvrouter/internal/admission"
	"slices"
)

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

// onReplicaRemoved registers f, called with the name of each engine
// removed from the fleet while serving (Server.ReplicaRemoved), for
// another front to delete its series of it; f must not block.
func (s *Server) onReplicaRemoved(f func(replica string)) {
	s.removedMu.Lock()
	defer s.removedMu.Unlock()
	s.removed = append(s.removed, f)
}

// Picker returns admission for another front: the endpoint picker
// (admission.Core.Picker), reading this front's readiness (GET /ready)
// and told of the engines it removes.
func (s *Server) Picker() *admission.Picker {
	return s.core.Picker(admission.PickerDeps{
		Ready:            func() bool { return s.readiness(false).Ready },
		OnReplicaRemoved: s.onReplicaRemoved,
		Bodies:           s.bodies,
		CountClientControl: func(control string) {
			s.lm.clients.WithLabelValues(control).Inc()
		},
	})
}
