// Package bodybudget bounds the bytes of request bodies one process holds
// at once, across its fronts (config.Config.BodyBudget): the HTTP front
// and the endpoint picker take from the same Budget, so the bound holds
// for the process, not for each front.
package bodybudget

import (
	"runtime/debug"
	"sync/atomic"
	"time"
)

// Returning memory after a burst of bodies. The runtime's background
// scavenger hands freed pages back to the OS slowly: measured on this
// router, 34 bodies of 15 MiB freed at once left 561 of 572 MB resident
// four minutes later (docs/results/2026-12-04-body-budget.md). So when the
// bytes held fall from a peak of at least ReleaseAbove to an eighth of it,
// the Budget calls its release function (debug.FreeOSMemory: a forced GC,
// then the free pages returned) in a goroutine of its own, at most once
// per ReleaseEvery: a cost of one GC cycle per burst, never per request.
const (
	ReleaseAbove = 64 << 20
	ReleaseEvery = 10 * time.Second
)

// Budget is a bound on bytes held at once. Take reserves bytes before a
// body is read into them and Give returns them when the body is dropped.
// Safe for concurrent use; the zero value has no bound.
type Budget struct {
	max  int64 // <= 0: no bound
	used atomic.Int64
	// release returns free memory to the OS; peak is the most held since
	// the last release, last its time in unix nanoseconds, releasing set
	// while a release runs.
	release   func()
	peak      atomic.Int64
	last      atomic.Int64
	releasing atomic.Bool
}

// New returns a Budget of max bytes (<= 0: no bound) that returns memory
// to the OS with debug.FreeOSMemory after a burst.
func New(max int64) *Budget { return &Budget{max: max, release: debug.FreeOSMemory} }

// Max is the bound in bytes (<= 0: none).
func (b *Budget) Max() int64 { return b.max }

// Held is the number of bytes taken and not yet given back.
func (b *Budget) Held() int64 { return b.used.Load() }

// Take reserves n bytes (n >= 0) and reports whether they fit; on false
// nothing is reserved.
func (b *Budget) Take(n int64) bool {
	for {
		u := b.used.Load()
		if b.max > 0 && u+n > b.max {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			for p := b.peak.Load(); u+n > p && !b.peak.CompareAndSwap(p, u+n); p = b.peak.Load() {
			}
			return true
		}
	}
}

// Give returns n bytes taken (n >= 0), and starts a release after a burst.
func (b *Budget) Give(n int64) {
	if n == 0 {
		return
	}
	u := b.used.Add(-n)
	p := b.peak.Load()
	if b.release == nil || p < ReleaseAbove || u > p/8 || time.Now().UnixNano()-b.last.Load() < int64(ReleaseEvery) || !b.releasing.CompareAndSwap(false, true) {
		return
	}
	b.peak.Store(u)
	b.last.Store(time.Now().UnixNano())
	go func() {
		defer b.releasing.Store(false)
		b.release()
	}()
}
