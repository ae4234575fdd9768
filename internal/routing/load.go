package routing

import (
	"math"
	"sync/atomic"
	"time"

	"kvrouter/internal/kvindex"
)

// Gauges are an engine's scraped load gauges.
type Gauges struct {
	// Waiting and Running are vllm:num_requests_waiting and
	// vllm:num_requests_running.
	Waiting, Running int
	// KVUsage is vllm:kv_cache_usage_perc, 0..1.
	KVUsage float64
	// At is when they were scraped (Config.Now's clock).
	At time.Time
}

// replica is one replica's routing state. Counters change only through
// leases.
type replica struct {
	name    string
	id      kvindex.ReplicaID
	healthy atomic.Bool
	gone    atomic.Bool
	// distrusted: the index's view of this replica is ignored (its
	// candidates get no Match) until SetIndexTrusted(name, true).
	distrusted atomic.Bool

	inFlight, queuedPrefill, runningDecode, activeTokens atomic.Int64
	decisions                                            atomic.Int64

	prefillRate, decodeRate atomic.Uint64 // float64 bits
	capacity                atomic.Int64  // KV cache blocks, 0: unknown
	gauges                  atomic.Pointer[Gauges]
	learn                   rateLearner
}

func (r *replica) load(now time.Time, maxAge time.Duration) Load {
	l := Load{
		InFlight:      r.inFlight.Load(),
		QueuedPrefill: r.queuedPrefill.Load(),
		RunningDecode: r.runningDecode.Load(),
		ActiveTokens:  r.activeTokens.Load(),
		PrefillRate:   math.Float64frombits(r.prefillRate.Load()),
		DecodeRate:    math.Float64frombits(r.decodeRate.Load()),
	}
	if g := r.gauges.Load(); g != nil && now.Sub(g.At) <= maxAge {
		l.Waiting, l.Running, l.KVUsage, l.Fresh = g.Waiting, g.Running, g.KVUsage, true
	}
	return l
}

// Lease holds one routed request's load on its replica until Release. All
// methods are idempotent and safe for concurrent use; call Release exactly
// once on every exit path (`defer lease.Release()`), FirstToken when the
// first output token arrives.
type Lease struct {
	r       *replica
	m       *metrics
	prefill int64 // uncached prompt tokens, queued until the first token
	// ttft is the predicted time to the first token: the prefill queued
	// on the replica before this request plus its own, at the replica's
	// prefill rate.
	ttft     time.Duration
	decode   int64 // expected output tokens
	active   int64 // prompt + output tokens
	state    atomic.Uint32
	decision Decision
	// cancel and pred undo the decision's predicted blocks (Failed); nil
	// when none were recorded.
	cancel matchRouter
	pred   kvindex.Prediction
	failed atomic.Bool
}

const (
	leaseQueued uint32 = iota
	leaseDecoding
	leaseReleased
)

func newLease(r *replica, m *metrics, prefill, decode, active int64) *Lease {
	l := &Lease{r: r, m: m, prefill: prefill, decode: decode, active: active}
	ahead := r.queuedPrefill.Add(prefill)
	if pr := math.Float64frombits(r.prefillRate.Load()); pr > 0 {
		l.ttft = time.Duration(float64(ahead) / pr * float64(time.Second))
	}
	r.inFlight.Add(1)
	r.activeTokens.Add(active)
	return l
}

// Replica returns the name of the replica the lease is on.
func (l *Lease) Replica() string { return l.r.name }

// PredictedTTFT is the time from sending the request to its first token
// the router predicts: the prefill queued on the replica when it was
// routed (its own uncached prompt tokens included) at the replica's
// prefill rate (configured, set or learned). 0 when the rate is unknown.
func (l *Lease) PredictedTTFT() time.Duration { return l.ttft }

// FirstToken moves the request from queued prefill to running decode. Calls
// after the first, or after Release, do nothing.
func (l *Lease) FirstToken() {
	if l.state.CompareAndSwap(leaseQueued, leaseDecoding) {
		l.sub(&l.r.queuedPrefill, l.prefill)
		l.r.runningDecode.Add(l.decode)
	}
}

// Failed tells the index that the engine answered the request with an
// error (or never got it): the blocks predicted for it will not be stored,
// so they are dropped now instead of attracting other requests until the
// prediction TTL (kvindex.Exact.Cancel; blocks that requests routed before
// predicted too stay). It does not release the load. Calls after the first
// do nothing.
func (l *Lease) Failed() {
	if l.cancel != nil && !l.failed.Swap(true) {
		l.cancel.Cancel(l.pred)
	}
}

// Release removes the request's load. Calls after the first do nothing.
func (l *Lease) Release() {
	for {
		s := l.state.Load()
		if s == leaseReleased {
			return
		}
		if !l.state.CompareAndSwap(s, leaseReleased) {
			continue
		}
		if s == leaseQueued {
			l.sub(&l.r.queuedPrefill, l.prefill)
		} else {
			l.sub(&l.r.runningDecode, l.decode)
		}
		l.sub(&l.r.inFlight, 1)
		l.sub(&l.r.activeTokens, l.active)
		return
	}
}

// sub subtracts v from c, counting and undoing an underflow (a bug in the
// accounting, never expected).
func (l *Lease) sub(c *atomic.Int64, v int64) {
	if n := c.Add(-v); n < 0 {
		c.Add(-n)
		if l.m != nil {
			l.m.underflow.Add(1)
		}
	}
}
