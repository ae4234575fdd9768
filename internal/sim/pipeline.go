package sim

import (
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"kvrouter/internal/vllm"
)

// PipelineMode chooses whether a policy's fleet applies KV event batches to
// its index on a second goroutine (see Config.Pipeline).
type PipelineMode string

// The Config.Pipeline values.
const (
	// PipelineAuto (also the zero value "") pipelines a fleet while fewer
	// policies remain to run than GOMAXPROCS, i.e. while a core is free.
	PipelineAuto PipelineMode = "auto"
	// PipelineOn pipelines every fleet that keeps an index.
	PipelineOn PipelineMode = "on"
	// PipelineOff applies every batch on the fleet's own goroutine.
	PipelineOff PipelineMode = "off"
)

// Sizes of the pipeline's handoff: a chunk goes to the applier once it holds
// chunkBatches batches or chunkEvents events, or at a barrier (sync); the
// fleet waits while maxChunks chunks are queued, which bounds the copies in
// flight (about maxChunks x chunkEvents x 176 bytes, 46 MB, plus one batch
// per chunk). Also measured: handing over every batch while the applier
// idles (no faster on the Mooncake x2 kv run, 10.6 s vs 10.4 s in 3 paired
// runs, and 0.2 s more system time: a wakeup per batch), chunks of 8 to 128
// batches (all within noise), and expanding the next arrivals' tokens while
// waiting at a barrier (no gain in 6 paired runs).
const (
	chunkBatches = 32
	chunkEvents  = 4096
	maxChunks    = 64
)

// batchApplier is what the pipeline feeds: *kvindex.Exact.
type batchApplier interface {
	Apply(engine string, b *vllm.Batch)
}

// applyItem is one batch bound for the index: the replica's name, the
// virtual time the sequential simulator applies it at, and its events as
// the range lo:hi of the chunk's evs.
type applyItem struct {
	name   string
	at     time.Duration
	ts     float64
	rank   int
	lo, hi int
}

// chunk is a run of batches handed over at once. Its buffers are reused.
type chunk struct {
	items []applyItem
	evs   []vllm.Event
}

// pipeline applies KV event batches to an index on its own goroutine, one
// batch at a time in the order push queued them (one applier, FIFO), so the
// index ends in exactly the state sequential applies give.
//
// The fleet's goroutine pushes batches (copying the events: a core's
// StepResult.Events is reused by its next Step; the slices inside events are
// never reused and are shared, read-only) and calls sync before anything
// that reads or changes the index. Between syncs the two goroutines share
// nothing but the mutex-guarded queue: the applier alone touches the index
// and *now, the index's clock, which it sets to each batch's apply time.
// A panic in the applier is recovered and returned by sync and push.
// stop ends the goroutine; the fleet calls it on every exit path.
type pipeline struct {
	ix  batchApplier
	now *time.Duration // the index's clock: written by the applier per batch

	cur *chunk // being filled; owned by the fleet's goroutine

	mu       sync.Mutex
	work     sync.Cond // the applier waits for a chunk or stop
	idle     sync.Cond // the fleet waits for room or for the queue to drain
	full     []*chunk  // handed over, FIFO
	free     []*chunk
	busy     bool // the applier is applying a chunk
	appWait  bool // the applier waits on work
	stopped  bool
	mainWait int // the fleet waits on idle: 1 for room, 2 for drained
	err      error

	abort  atomic.Bool // stop asked: drop what is left
	exited chan struct{}

	copied atomic.Int64 // events copied by push (a measure of the copy cost)
}

// newPipeline starts the applier goroutine feeding ix; the applier sets
// *now to each batch's apply time before applying it.
func newPipeline(ix batchApplier, now *time.Duration) *pipeline {
	p := &pipeline{ix: ix, now: now, cur: &chunk{}, exited: make(chan struct{})}
	p.work.L, p.idle.L = &p.mu, &p.mu
	go p.loop()
	return p
}

// push queues a batch of engine's events, applied at virtual time at. It
// copies b.Events (the Event structs, not the slices they hold) and hands
// the chunk over when it is full. It blocks
// only when maxChunks chunks wait; it returns the applier's error, if any.
func (p *pipeline) push(engine string, at time.Duration, b *vllm.Batch) error {
	c := p.cur
	lo := len(c.evs)
	c.evs = append(c.evs, b.Events...)
	c.items = append(c.items, applyItem{name: engine, at: at, ts: b.TS, rank: b.DataParallelRank, lo: lo, hi: len(c.evs)})
	if len(c.items) >= chunkBatches || len(c.evs) >= chunkEvents {
		return p.handOver(1)
	}
	return nil
}

// handOver queues the current chunk, if any, and takes a fresh one. With
// want 1 it first waits for room; with 2 it then waits until every queued
// chunk is applied.
func (p *pipeline) handOver(want int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.cur; len(c.items) > 0 {
		for len(p.full) >= maxChunks && p.err == nil {
			p.mainWait = 1
			p.idle.Wait()
		}
		p.copied.Add(int64(len(c.evs)))
		p.full = append(p.full, c)
		if n := len(p.free); n > 0 {
			p.cur, p.free = p.free[n-1], p.free[:n-1]
		} else {
			p.cur = &chunk{}
		}
		if p.appWait {
			p.work.Signal()
		}
	}
	for want == 2 && (len(p.full) > 0 || p.busy) && p.err == nil {
		p.mainWait = 2
		p.idle.Wait()
	}
	p.mainWait = 0
	return p.err
}

// sync hands over what push queued and waits until the applier has applied
// all of it: afterwards the fleet's goroutine may use the index (until the
// next push). It returns the applier's error, if any.
func (p *pipeline) sync() error { return p.handOver(2) }

// stop ends the applier, dropping batches not yet applied, and waits for
// it to exit. It is idempotent.
func (p *pipeline) stop() {
	p.abort.Store(true)
	p.mu.Lock()
	p.stopped = true
	p.work.Signal()
	p.mu.Unlock()
	<-p.exited
}

// loop is the applier goroutine.
func (p *pipeline) loop() {
	defer close(p.exited)
	defer func() {
		if v := recover(); v != nil {
			p.mu.Lock()
			p.err = fmt.Errorf("index applier panic: %v\n%s", v, debug.Stack())
			p.busy = false
			p.idle.Signal()
			p.mu.Unlock()
		}
	}()
	p.mu.Lock()
	for {
		for len(p.full) == 0 && !p.stopped {
			p.appWait = true
			p.work.Wait()
			p.appWait = false
		}
		if p.stopped {
			p.mu.Unlock()
			return
		}
		c := p.full[0]
		copy(p.full, p.full[1:])
		p.full[len(p.full)-1] = nil
		p.full = p.full[:len(p.full)-1]
		p.busy = true
		p.mu.Unlock()

		p.apply(c)

		p.mu.Lock()
		p.busy = false
		p.free = append(p.free, c)
		if p.mainWait == 1 || p.mainWait == 2 && len(p.full) == 0 {
			p.idle.Signal()
		}
	}
}

// apply applies c's batches in order and empties c (keeping its capacity,
// not the event slices it referenced).
func (p *pipeline) apply(c *chunk) {
	var b vllm.Batch
	for i := range c.items {
		if p.abort.Load() {
			break
		}
		it := &c.items[i]
		*p.now = it.at
		b = vllm.Batch{TS: it.ts, Events: c.evs[it.lo:it.hi:it.hi], DataParallelRank: it.rank}
		p.ix.Apply(it.name, &b)
	}
	clear(c.items)
	c.items = c.items[:0]
	clear(c.evs)
	c.evs = c.evs[:0]
}

// startPipeline moves the fleet's index applies onto a pipeline (a no-op
// without an index or when already pipelined).
func (f *fleet) startPipeline() {
	if f.ix != nil && f.pipe == nil {
		f.pipe = newPipeline(f.ix, &f.ixAt)
	}
}

// stopPipeline ends the pipeline's goroutine, if any. The fleet defers it
// on every exit path.
func (f *fleet) stopPipeline() {
	if f.pipe != nil {
		f.pipe.stop()
	}
}

// syncIndex makes the index current before the fleet reads or changes it
// (Route, AddReplica, RemoveReplica, the end of the run): every batch the
// sequential simulator would have applied by now is applied, and the
// index's clock reads now. Under PipelineAuto it starts the pipeline once
// a core is free. It fails only when the pipeline does.
func (f *fleet) syncIndex() error {
	if f.ix == nil {
		return nil
	}
	if f.pipe != nil {
		if err := f.pipe.sync(); err != nil {
			return fmt.Errorf("sim %s: %w", f.policy, err)
		}
	} else if f.coreFree != nil && f.coreFree() {
		f.startPipeline()
	}
	f.ixAt = f.now
	return nil
}
