package proxy

import "sync"

// replicaSeries tracks, per replica name, the exchanges that may still
// write its series (kvrouter_proxy_requests_total{replica},
// kvrouter_proxy_in_flight_requests{replica}), so that a removed engine's
// series are deleted once the last of them has finished and are not
// re-created by it. Safe for concurrent use.
type replicaSeries struct {
	mu   sync.Mutex
	held map[string]int // exchanges holding each replica's series
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
func (s *Server) ReplicaRemoved(replica string) {
	s.reps.mu.Lock()
	defer s.reps.mu.Unlock()
	s.dropSeriesLocked(replica)
}
