package proxy

import (
	"slices"
	"sync"
)

// replicaSeries tracks, per replica name, the exchanges that may still
// write its series (kvrouter_proxy_requests_total{replica},
// kvrouter_proxy_in_flight_requests{replica}), so that a removed engine's
// series are deleted once the last of them has finished and are not
// re-created by it. Safe for concurrent use.
type replicaSeries struct {
	mu      sync.Mutex
	held    map[string]int         // exchanges holding each replica's series
	removed []func(replica string) // other fronts' hooks (Picker.OnReplicaRemoved)
}

// hold marks x as writing replica's series until finish releases it.
func (s *Server) hold(x *exchange, replica string) {
	for _, r := range x.held {
		if r == replica {
			return
		}
	}
	x.held = append(x.held, replica)
	s.reps.mu.Lock()
	s.reps.held[replica]++
	s.reps.mu.Unlock()
}

// release ends x's holds; the series of a replica no longer in the fleet
// whose last hold this was are deleted.
func (s *Server) release(x *exchange) {
	s.reps.mu.Lock()
	defer s.reps.mu.Unlock()
	for _, r := range x.held {
		if s.reps.held[r]--; s.reps.held[r] <= 0 {
			delete(s.reps.held, r)
			s.dropSeriesLocked(r)
		}
	}
	x.held = nil
}

// dropSeriesLocked deletes replica's series unless the fleet has an
// endpoint of that name (still there, or added again) or a request still
// holds them.
func (s *Server) dropSeriesLocked(replica string) {
	if s.reps.held[replica] > 0 || s.deps.Fleet.Endpoint(replica) != nil {
		return
	}
	s.m.view.DeleteReplica(replica) // front="http" only: the EPP's series are its own
}

// ReplicaAdded creates the series of an engine added to model's group
// while serving, at 0 (as New does for the engines present at start).
func (s *Server) ReplicaAdded(model, replica string) {
	s.reps.mu.Lock()
	defer s.reps.mu.Unlock()
	s.m.inFlight.WithLabelValues(replica).Add(0)
	s.m.initReplica(model, replica)
}

// ReplicaRemoved deletes the series of an engine removed from the fleet
// (call after fleet.Fleet.Remove): at once when no request holds them,
// else when the last request on it has finished and been counted. An
// engine added again under the same name keeps its series.
// The other fronts' hooks (Picker.OnReplicaRemoved) are called after, for
// theirs.
func (s *Server) ReplicaRemoved(replica string) {
	s.reps.mu.Lock()
	s.dropSeriesLocked(replica)
	hooks := slices.Clone(s.reps.removed)
	s.reps.mu.Unlock()
	for _, f := range hooks {
		f(replica)
	}
}

// OnReplicaRemoved registers f, called with the name of each engine
// removed from the fleet while serving (Server.ReplicaRemoved), for
// another front to delete its series of it; f must not block.
func (p *Picker) OnReplicaRemoved(f func(replica string)) {
	p.s.reps.mu.Lock()
	defer p.s.reps.mu.Unlock()
	p.s.reps.removed = append(p.s.reps.removed, f)
}

// HasReplica reports whether the fleet has an engine named replica (still
// there, or added again under that name).
func (p *Picker) HasReplica(replica string) bool { return p.s.deps.Fleet.Endpoint(replica) != nil }
