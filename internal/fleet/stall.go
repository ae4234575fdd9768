package fleet

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Stall detection. A stopped engine process (SIGSTOP, a wedged host, a
// network partition that drops packets) refuses nothing: connections are
// accepted by the kernel and requests wait for answers that never come, and
// /health probes only eject it after EjectAfterProbeTimeouts probe periods.
// Meanwhile every new request routed to it waits too. The proxy reports when
// it sends a request (Endpoint.Await) and every sign of life (Endpoint.Heard:
// response headers and body bytes; probes and scrapes answered count too).
// An engine is stalled when a request has waited StallAfter for its answer
// and the engine has shown no sign of life, on any request or probe, for
// the stall window (StallAfter, and at least 1.5 scrape intervals so a busy
// engine whose only answers are scrapes is not mistaken for a stopped one).
// A stalled engine takes no new requests (it counts as down for timeouts:
// panic mode may still route it) until its next sign of life.

// stallState is an Endpoint's stall bookkeeping.
type stallState struct {
	heard   atomic.Int64 // unix ns of the last sign of life (0: none yet)
	stalled atomic.Bool

	mu      sync.Mutex
	waits   map[uint64]int64 // request -> unix ns it was sent, until its answer starts
	next    uint64
	stallAt int64 // unix ns the stall was declared
}

// Await records a request sent to the engine at now that has had no answer
// yet. Call the returned function when the answer starts (response
// headers or a first body byte) and, in any case, when the request ends;
// calls after the first do nothing. Safe for concurrent use.
func (e *Endpoint) Await(now time.Time) (answered func()) {
	s := &e.stall
	s.mu.Lock()
	if s.waits == nil {
		s.waits = map[uint64]int64{}
	}
	s.next++
	id := s.next
	s.waits[id] = now.UnixNano()
	s.mu.Unlock()
	var done atomic.Bool
	return func() {
		if done.Swap(true) {
			return
		}
		s.mu.Lock()
		delete(s.waits, id)
		s.mu.Unlock()
	}
}

// Heard records a sign of life from the engine at now: response headers or
// body bytes of any request, an answered probe or scrape. One atomic store
// (a few ns): it is called per relayed chunk.
func (e *Endpoint) Heard(now time.Time) {
	if ns := now.UnixNano(); ns > e.stall.heard.Load() {
		e.stall.heard.Store(ns)
	}
}

// Stalled reports whether the engine is held out of routing as stalled.
func (e *Endpoint) Stalled() bool { return e.stall.stalled.Load() }

// waiting returns how many requests wait for their answer and when the
// oldest was sent (unix ns; 0 when none).
func (s *stallState) waiting() (n int, oldest int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range s.waits {
		if oldest == 0 || t < oldest {
			oldest = t
		}
	}
	return len(s.waits), oldest
}

// stallWindow is how long an engine must show no sign of life, with a
// request waiting StallAfter, to be declared stalled.
func (f *Fleet) stallWindow() time.Duration {
	w := f.cfg.StallAfter
	if f.cfg.ScrapeInterval > 0 {
		w = max(w, f.cfg.ScrapeInterval*3/2)
	}
	return w
}

// watchStalls checks every endpoint each StallAfter/4 (25ms..250ms) until
// ctx ends.
func (f *Fleet) watchStalls(ctx context.Context) {
	every := min(max(f.cfg.StallAfter/4, 25*time.Millisecond), 250*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, ep := range f.All() {
			f.checkStall(ep)
		}
	}
}

// checkStall declares ep stalled, or lets it back, at f's clock.
func (f *Fleet) checkStall(ep *Endpoint) {
	s := &ep.stall
	now := f.cfg.Now().UnixNano()
	heard := s.heard.Load()
	if s.stalled.Load() {
		s.mu.Lock()
		back := heard > s.stallAt
		if back {
			s.stalled.Store(false)
		}
		s.mu.Unlock()
		if !back {
			return
		}
		f.withMetrics(ep, func(m *metrics) {
			if ep.Up() {
				m.up.WithLabelValues(ep.name).Set(1)
			}
		})
		f.log.Info("stalled endpoint answers again", "endpoint", ep.name)
		f.refreshPanic(ep)
		return
	}
	n, oldest := s.waiting()
	if n == 0 || now-oldest < int64(f.cfg.StallAfter) || now-max(heard, oldest) < int64(f.stallWindow()) {
		return
	}
	s.mu.Lock()
	s.stalled.Store(true)
	s.stallAt = now
	s.mu.Unlock()
	f.withMetrics(ep, func(m *metrics) {
		m.up.WithLabelValues(ep.name).Set(0)
		m.ejections.WithLabelValues(ep.name, "stall").Inc()
	})
	f.log.Warn("endpoint stalled: requests wait for an answer and it shows no sign of life; no new requests until it answers",
		"endpoint", ep.name, "waiting", n, "oldest_wait_ms", (now-oldest)/int64(time.Millisecond),
		"silent_ms", (now-max(heard, oldest))/int64(time.Millisecond))
	f.refreshPanic(ep)
}
