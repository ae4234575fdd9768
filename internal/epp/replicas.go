package epp

import "sync"

// replicaSeries tracks, per engine name, the ext_proc streams that may
// still write the EPP front's series of it
// (kvrouter_proxy_requests_total{front="epp",replica},
// kvrouter_proxy_in_flight_requests{front="epp",replica}), so that an
// engine removed from the pool loses them once its last request has ended
// and been counted, and no stream re-creates them after: the HTTP front
// does the same for its own (proxy.Server.ReplicaRemoved). Safe for
// concurrent use.
type replicaSeries struct {
	mu   sync.Mutex
	held map[string]int // streams holding each engine's series
}

// hold marks x as writing replica's series until release.
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

// release ends x's holds (its request is counted); the series of an engine
// no longer in the pool whose last hold this was are deleted.
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

// dropSeriesLocked deletes replica's front="epp" series unless the pool has
// an engine of that name (still there, or added again) or a stream still
// holds them. The HTTP front's series are its own.
func (s *Server) dropSeriesLocked(replica string) {
	if s.reps.held[replica] > 0 || s.pick.HasReplica(replica) {
		return
	}
	s.m.DeleteReplica(replica)
}

// replicaRemoved is the hook the picker calls for an engine removed from
// the pool (proxy.Picker.OnReplicaRemoved): its series go now when no
// stream holds them, else when the last one ends.
func (s *Server) replicaRemoved(replica string) {
	s.reps.mu.Lock()
	defer s.reps.mu.Unlock()
	s.dropSeriesLocked(replica)
}
