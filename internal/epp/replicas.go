package epp

// An engine removed from the pool loses its front="epp" series once its
// last stream has ended and been counted (frontmetrics.Holds, the same
// mechanism as the HTTP front's): a stream holds the engines it picked,
// was served by or passed through (exchange.held) until Process ends.

// replicaRemoved is the hook the picker calls for an engine removed from
// the pool (Picker.OnReplicaRemoved): its series go now when no
// stream holds them, else when the last one ends.
func (s *Server) replicaRemoved(replica string) { s.holds.Removed(replica) }
