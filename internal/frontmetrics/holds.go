package frontmetrics

import (
	"slices"
	"sync"
)

// Holds counts, per replica name, the requests that may still write one
// front's series of it (kvrouter_proxy_requests_total{front,replica},
// kvrouter_proxy_in_flight_requests{front,replica}), so that a replica
// removed from the pool loses them once its last request has ended and
// been counted, and no request re-creates them after. Each front keeps its
// own Holds over its own Front. Safe for concurrent use.
type Holds struct {
	mu      sync.Mutex
	held    map[string]int
	front   *Front
	present func(replica string) bool
}

// NewHolds returns the holds of front's series; present reports whether
// the pool has a replica of that name (still there, or added again), whose
// series then stay.
func NewHolds(front *Front, present func(replica string) bool) *Holds {
	return &Holds{held: map[string]int{}, front: front, present: present}
}

// Hold records in *held (one request's list) that the request writes
// replica's series until Release; a replica already in the list is held
// once.
func (h *Holds) Hold(held *[]string, replica string) {
	if slices.Contains(*held, replica) {
		return
	}
	*held = append(*held, replica)
	h.mu.Lock()
	h.held[replica]++
	h.mu.Unlock()
}

// Release ends the holds in *held (call once the request is counted) and
// empties it; the series of a replica no longer in the pool whose last hold
// this was are deleted.
func (h *Holds) Release(held *[]string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range *held {
		if h.held[r]--; h.held[r] <= 0 {
			delete(h.held, r)
			h.dropLocked(r)
		}
	}
	*held = nil
}

// Removed deletes replica's series of a replica removed from the pool: at
// once when no request holds them, else at the last Release.
func (h *Holds) Removed(replica string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.dropLocked(replica)
}

// Locked runs fn under the holds' lock, e.g. to create a replica added
// again at 0 without a concurrent Release deleting them.
func (h *Holds) Locked(fn func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	fn()
}

func (h *Holds) dropLocked(replica string) {
	if h.held[replica] > 0 || h.present(replica) {
		return
	}
	h.front.DeleteReplica(replica)
}
