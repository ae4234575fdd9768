package enginesim

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"kvrouter/internal/vllm"
)

// Errors that end a stream from the engine side.
var (
	errRestarted = errors.New("engine restarted")
	errStopped   = errors.New("engine stopped")
)

// stream is one engine request's output, filled by the engine loop and
// drained by its HTTP handler. notify (shared by all streams of one HTTP
// request, capacity 1) is signalled after every change.
type stream struct {
	id     string
	notify chan struct{}

	mu           sync.Mutex
	toks         []uint32
	generated    int
	promptTokens int
	cachedTokens int
	finished     bool
	reason       string
	err          error
	submitted    time.Time
	blockIDs     []int32 // Output.BlockIDs of a prefill leg
}

func newStream(id string, notify chan struct{}) *stream {
	return &stream{id: id, notify: notify, cachedTokens: -1}
}

func (st *stream) signal() {
	select {
	case st.notify <- struct{}{}:
	default:
	}
}

func (st *stream) push(o *Output) {
	st.mu.Lock()
	st.toks = append(st.toks, o.Token)
	st.generated++
	st.promptTokens, st.cachedTokens = o.PromptTokens, o.CachedTokens
	if o.Finished {
		st.finished, st.reason = true, o.FinishReason
		st.blockIDs = o.BlockIDs
	}
	st.mu.Unlock()
	st.signal()
}

func (st *stream) fail(err error) {
	st.mu.Lock()
	if !st.finished && st.err == nil {
		st.err = err
	}
	st.mu.Unlock()
	st.signal()
}

// streamState is what a handler takes from a stream.
type streamState struct {
	toks     []uint32
	finished bool
	reason   string
	err      error
	cached   int
	blockIDs []int32
}

// take moves the new tokens into buf (reused) and reports the state.
func (st *stream) take(buf []uint32) streamState {
	st.mu.Lock()
	defer st.mu.Unlock()
	s := streamState{toks: append(buf[:0], st.toks...), finished: st.finished, reason: st.reason, err: st.err, cached: st.cachedTokens, blockIDs: st.blockIDs}
	st.toks = st.toks[:0]
	return s
}

// submission is one engine request and its stream.
type submission struct {
	req Request
	st  *stream
}

// command is one message to the engine loop.
type command struct {
	submit  []submission
	abort   []string
	restart bool
	// pubReopened, with restart, gets the publisher's reopen outcome.
	pubReopened chan<- error
	reset       bool
	reply       chan error
	// received ends the KV transfer of that request, started in epoch.
	received string
	epoch    int
	// freeze, when not nil, freezes the core for that long from now (0:
	// thaws it now).
	freeze *time.Duration
}

// engine owns a Core and the streams of its requests; only its loop
// goroutine touches them. It steps the core in real time: a step of
// duration d is delivered d after it started.
type engine struct {
	newCore func() (*Core, error)
	clock   Clock
	faults  Faults
	pub     *publisher // nil without KV events
	rank    int
	// trackLoRA: the snapshot lists the adapters in use (LoRA enabled).
	trackLoRA bool
	m         *metrics
	state     *atomic.Pointer[snapshot]

	cmds chan command
	done chan struct{} // closed when the loop returns

	core      *Core
	streams   map[string]*stream
	startedAt time.Time
	epoch     int
	outs      []Output
	pd        *pdState // nil without a KV connector
	// frozenUntil: until then the core is hung (POST /admin/freeze): no
	// step runs, no state is published (the metrics stay as they were),
	// commands are still taken (as vLLM's core process reads its input
	// socket on its own thread).
	frozenUntil time.Time
	wg          sync.WaitGroup // transfer timers (pdserver.go)
	// modelled sums the modelled durations of the steps run (ns); late
	// sums the clock time they took beyond that (ns): the core's own
	// compute and timers firing late on a busy machine.
	modelled, late atomic.Int64
}

// send delivers c to the loop; it fails when the loop is gone or ctx ends.
func (e *engine) send(ctx context.Context, c command) error {
	select {
	case e.cmds <- c:
	case <-e.done:
		return errStopped
	case <-ctx.Done():
		return ctx.Err()
	}
	if c.reply == nil {
		return nil
	}
	select {
	case err := <-c.reply:
		return err
	case <-e.done:
		return errStopped
	case <-ctx.Done():
		return ctx.Err()
	}
}

// abort tells the loop to drop requests; it never blocks for long (the
// loop drains commands during every step) and gives up when the loop ends.
func (e *engine) abort(ids []string) {
	if len(ids) > 0 {
		_ = e.send(context.Background(), command{abort: ids})
	}
}

func (e *engine) run(ctx context.Context) error {
	defer close(e.done)
	defer e.wg.Wait() // transfer timers end with ctx
	defer e.failAll(errStopped)
	e.startedAt = e.clock.Now()
	e.publishState()
	for {
		if e.frozen() {
			if _, ok := e.waitFrozen(ctx); !ok {
				return nil
			}
			continue
		}
		if e.core.Idle() {
			select {
			case <-ctx.Done():
				return nil
			case c := <-e.cmds:
				e.apply(ctx, c)
			}
		}
		if !e.drainCommands(ctx) {
			return nil
		}
		if e.frozen() {
			continue
		}
		stepStart := e.clock.Now()
		res := e.core.Step()
		start := e.clock.Now()
		if len(res.Transfers) > 0 {
			e.startTransfers(ctx, res.Transfers)
		}
		if res.Scheduled == 0 {
			e.emit(res.Events, start)
			e.publishState()
			// Not idle after a step that scheduled nothing cannot happen
			// (NewCore checks capacity), except when a transfer of nothing
			// made a request runnable: never spin, but run that one.
			if !e.core.Idle() && len(res.Transfers) == 0 {
				select {
				case <-ctx.Done():
					return nil
				case c := <-e.cmds:
					e.apply(ctx, c)
				}
			}
			continue
		}
		f := e.faults.slowFactor(start.Sub(e.startedAt))
		d := time.Duration(float64(res.Duration) * f)
		e.outs = append(e.outs[:0], res.Outputs...)
		events, epoch := res.Events, e.epoch
		deadline := start.Add(d)
		var frozenFor time.Duration
		for {
			rem := deadline.Sub(e.clock.Now())
			if rem <= 0 {
				break
			}
			select {
			case <-ctx.Done():
				return nil
			case c := <-e.cmds:
				e.apply(ctx, c)
				if e.frozen() { // hung mid-step: the rest of it runs after the thaw
					f, ok := e.waitFrozen(ctx)
					if !ok {
						return nil
					}
					frozenFor += f
					deadline = deadline.Add(f)
				}
			case <-e.clock.After(rem):
			}
		}
		e.modelled.Add(int64(d))
		if over := e.clock.Now().Sub(stepStart) - d - frozenFor; over > 0 {
			e.late.Add(int64(over))
		}
		if epoch != e.epoch { // restarted during the step: its results are gone
			continue
		}
		e.publishState() // before delivering: a client that got its answer sees it in /metrics
		e.deliver(deadline)
		e.emit(events, deadline)
	}
}

// frozen reports whether the core is hung now (POST /admin/freeze).
func (e *engine) frozen() bool { return e.clock.Now().Before(e.frozenUntil) }

// waitFrozen waits until the core thaws, applying the commands that come
// meanwhile (requests are admitted and aborted, nothing is stepped or
// published), then publishes the state. It returns how long it waited,
// and false when ctx ended.
func (e *engine) waitFrozen(ctx context.Context) (time.Duration, bool) {
	from := e.clock.Now()
	for rem := e.frozenUntil.Sub(from); rem > 0; rem = e.frozenUntil.Sub(e.clock.Now()) {
		select {
		case <-ctx.Done():
			return 0, false
		case c := <-e.cmds:
			e.apply(ctx, c)
		case <-e.clock.After(rem):
		}
	}
	e.publishState()
	return e.clock.Now().Sub(from), true
}

// drainCommands applies queued commands without blocking; false when ctx
// ended.
func (e *engine) drainCommands(ctx context.Context) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case c := <-e.cmds:
			e.apply(ctx, c)
		default:
			return true
		}
	}
}

func (e *engine) apply(ctx context.Context, c command) {
	var err error
	for i, s := range c.submit {
		if err = e.core.Submit(&s.req); err != nil {
			for _, prev := range c.submit[:i] {
				e.core.Abort(prev.req.ID)
				delete(e.streams, prev.req.ID)
			}
			break
		}
		s.st.submitted = e.clock.Now()
		e.streams[s.req.ID] = s.st
	}
	for _, id := range c.abort {
		e.core.Abort(id)
		delete(e.streams, id)
	}
	if c.received != "" && c.epoch == e.epoch {
		e.core.Received(c.received)
	}
	if c.reset && !e.core.ResetPrefixCache() {
		err = errors.New("prefix cache in use: requests hold blocks")
	}
	if c.restart {
		err = e.restart(ctx, c.pubReopened)
	}
	if c.freeze != nil {
		e.frozenUntil = e.clock.Now().Add(*c.freeze)
	}
	e.publishState()
	if c.reply != nil {
		c.reply <- err
	}
}

// restart models an engine process restart: in-flight requests die, the
// cache is empty, counters and KV-event sequence numbers start again at 0
// and no AllBlocksCleared is sent.
// reopened (may be nil) gets the outcome of the publisher's new sockets.
func (e *engine) restart(ctx context.Context, reopened chan<- error) error {
	core, err := e.newCore()
	if err != nil {
		return err
	}
	e.failAll(errRestarted)
	e.core = core
	e.epoch++
	e.frozenUntil = time.Time{} // a new process: not hung
	e.startedAt = e.clock.Now()
	if e.pub != nil {
		return e.pub.control(ctx, pubMsg{restart: true, reopened: reopened})
	}
	return nil
}

func (e *engine) failAll(err error) {
	for id, st := range e.streams {
		st.fail(err)
		delete(e.streams, id)
	}
}

func (e *engine) deliver(now time.Time) {
	for i := range e.outs {
		o := &e.outs[i]
		st := e.streams[o.ID]
		if st == nil {
			continue
		}
		if o.Index == 0 {
			e.m.ttft.Observe(now.Sub(st.submitted).Seconds())
		}
		if o.Finished {
			e.m.e2e.Observe(now.Sub(st.submitted).Seconds())
			e.m.prefillTime.Observe(o.PrefillTime.Seconds())
			e.m.decodeTime.Observe(o.DecodeTime.Seconds())
			e.m.success.WithLabelValues(o.FinishReason).Inc()
			delete(e.streams, o.ID)
		}
		st.push(o)
	}
}

// emit hands a step's events to the publisher as one batch.
func (e *engine) emit(events []vllm.Event, ts time.Time) {
	if e.pub == nil || len(events) == 0 {
		return
	}
	e.pub.publish(vllm.Batch{
		TS:               float64(ts.UnixNano()) / 1e9,
		Events:           slices.Clone(events),
		DataParallelRank: e.rank,
	})
}

func (e *engine) publishState() {
	if e.frozen() {
		return // a hung core reports nothing: the metrics keep their values
	}
	var rl, wl []string
	if e.trackLoRA {
		rl, wl = e.core.ActiveLoRAs()
	}
	e.state.Store(&snapshot{
		runningLoRAs: rl, waitingLoRAs: wl,
		running: e.core.Running(),
		waiting: e.core.Waiting(),
		usage:   e.core.KVUsage(),
		stats:   e.core.Stats(),
	})
}
