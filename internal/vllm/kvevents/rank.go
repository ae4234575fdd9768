package kvevents

import (
	"context"
	"errors"
	"kvrouter/internal/vllm"
	"log/slog"
	"math"
	"net"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/zeebo/xxh3"
	"golang.org/x/sync/errgroup"
)

// rank is the state of one (engine, rank) stream. Its connection goroutines
// (dialLoop, or acceptLoop and one goroutine per accepted connection) only
// move raw messages to process; process alone owns seq, pending, lastSum,
// conn and the replayer, and is the only writer of this rank's Updates.
type rank struct {
	s      *Subscriber
	idx    int
	ep     zmtpEndpoint
	replay *replayer
	log    *slog.Logger
	m      *rankMetrics

	seq     seqTracker
	pending ResetReason // reset to attach to the next Update that reaches the queue
	lastSum uint64      // XXH3 of the payload of seq.applied (reconnect and idle checks, Update.Sum)
	conn    uint64      // id of the newest connection; older ones' messages are dropped
	// consumer queue overflow (overflow.go): behind is set while batches
	// after seq.applied were not queued (they are caught up by replay);
	// dropHW is 1 + the highest seq counted in queue_drops (0: none), so a
	// batch is counted once however often it finds the queue full;
	// warnedFull: the first overflow of this rank was warned about.
	behind     bool
	dropHW     uint64
	warnedFull bool
	wake       chan struct{} // cap 1: the consumer queue drained while behind
	waiting    atomic.Bool   // behind, as read by the apply goroutine
	// idle checks (reconnect.go): the interval to the next one, and whether
	// the last one changed nothing (it warned once)
	idleEvery   time.Duration
	idleFailing bool

	connIDs   atomic.Uint64 // numbers this rank's connections from 1
	conns     atomic.Int32  // live connections (bind mode may briefly have several)
	connected atomic.Bool   // a connection was up before: the next one is a reconnect
	accepted  atomic.Int32  // bind mode: accepted connections not yet closed (handshake included)
}

// liveMsg is what a connection goroutine hands to process: a live message
// received on connection conn, or (connect true, frames nil) the news that
// conn is a new connection, subscribed and about to be read. The
// connect message precedes every message of its connection.
type liveMsg struct {
	conn    uint64
	connect bool
	frames  [][]byte
}

func (s *Subscriber) newRank(i int) *rank {
	r := &rank{
		s: s, idx: i, ep: s.live[i], replay: s.replay[i],
		log:  s.log.With("rank", i, "endpoint", rankEndpoint(s.cfg.Endpoint, i)),
		m:    s.m.forRank(s.cfg.Engine, i),
		wake: make(chan struct{}, 1),
	}
	if r.replay != nil {
		r.replay.limit = r.frameLimit("replay")
	}
	return r
}

// resume starts rank r's stream after pos, as if the batch at pos.Seq
// had just been applied: the first connection checks by replay that the
// engine process is the one that published it, and goes on from there or
// resets the rank (reconnect.go).
func (r *rank) resume(pos Position) {
	r.seq = seqTracker{haveApplied: true, applied: pos.Seq}
	r.lastSum = pos.Sum
}

// dialLoop connects to the engine's PUB (connect mode), reads until the
// connection breaks, and redials with exponential backoff until ctx ends.
func (r *rank) dialLoop(ctx context.Context, in chan<- liveMsg) error {
	cfg := r.s.cfg
	backoff, failing := cfg.ReconnectMin, false
	for ctx.Err() == nil {
		if failing || r.connected.Load() {
			// Back off before every attempt but the first, so an engine
			// that accepts and drops connections is not hammered.
			sleepCtx(ctx, backoff)
			backoff = min(2*backoff, cfg.ReconnectMax)
		}
		dctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
		c, err := dialZMTP(dctx, r.ep, zmq4.Sub, r.frameLimit("events"))
		cancel()
		if err == nil {
			if err = c.subscribe(cfg.Topic); err != nil {
				c.close()
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			if !failing {
				r.log.Warn("cannot connect to engine, retrying", "err", err)
				failing = true
			}
			continue
		}
		failing = false
		err = r.serve(ctx, c, in)
		backoff = cfg.ReconnectMin
		if ctx.Err() == nil {
			r.log.Warn("connection to engine lost, reconnecting", "err", err)
		}
	}
	return nil
}

// acceptLoop accepts engines dialling in (bind mode) and serves each
// connection in its own goroutine until ctx ends. At most
// SubscriberConfig.MaxConns accepted connections are open at once (from
// accept to close, handshake included); a connection accepted beyond that is
// closed at once and counted in rejected_conns.
func (r *rank) acceptLoop(ctx context.Context, ln net.Listener, in chan<- liveMsg) error {
	g, gctx := errgroup.WithContext(ctx)
	stop := context.AfterFunc(gctx, func() { ln.Close() })
	defer stop()
	r.log.Info("listening for engine", "addr", ln.Addr().String())
	for {
		nc, err := ln.Accept()
		if err != nil {
			if gctx.Err() != nil {
				break
			}
			r.log.Warn("accept failed", "err", err)
			sleepCtx(gctx, r.s.cfg.ReconnectMin)
			continue
		}
		if int(r.accepted.Load()) >= r.s.cfg.MaxConns {
			// A rank has one engine; more than MaxConns connections at
			// once is a misbehaving peer (or stale half-open sockets not
			// yet seen to break): the newcomer is closed, the connections
			// already up keep going.
			nc.Close()
			r.count(&r.s.stats.rejectedConns, r.m.rejectedConns)
			r.log.Warn("engine connection refused: too many connections on this rank",
				"remote", nc.RemoteAddr().String(), "max_conns", r.s.cfg.MaxConns)
			continue
		}
		r.accepted.Add(1)
		g.Go(guard("conn", func() error {
			defer r.accepted.Add(-1)
			hctx, cancel := context.WithTimeout(gctx, r.s.cfg.DialTimeout)
			c, err := openZMTP(hctx, nc, zmq4.Sub, true, r.frameLimit("events"))
			cancel()
			if err == nil {
				if err = c.subscribe(r.s.cfg.Topic); err != nil {
					c.close()
				}
			}
			if err != nil {
				if gctx.Err() == nil {
					r.log.Warn("engine handshake failed", "remote", nc.RemoteAddr().String(), "err", err)
				}
				return nil
			}
			err = r.serve(gctx, c, in)
			if gctx.Err() == nil {
				r.log.Info("engine disconnected", "remote", nc.RemoteAddr().String(), "err", err)
			}
			return nil
		}))
	}
	ln.Close()
	return g.Wait()
}

// serve announces a new connection to process (which then checks the
// engine by replay, see onConnect), reads live messages from it into in
// until the connection breaks or ctx ends, then closes it. It returns the
// read error.
func (r *rank) serve(ctx context.Context, c *zmtpConn, in chan<- liveMsg) error {
	defer c.close()
	stop := context.AfterFunc(ctx, func() { c.close() })
	defer stop()
	if r.connected.Swap(true) {
		r.m.reconnects.Inc()
		r.s.stats.reconnects.Add(1)
	}
	r.conns.Add(1)
	r.m.connected.Set(1)
	r.log.Info("connected to engine")
	defer func() {
		if r.conns.Add(-1) == 0 {
			r.m.connected.Set(0)
		}
	}()
	id := r.connIDs.Add(1)
	select {
	case in <- liveMsg{conn: id, connect: true}:
	case <-ctx.Done():
		return ctx.Err()
	}
	for {
		frames, err := c.recv()
		if err != nil {
			return err
		}
		select {
		case in <- liveMsg{conn: id, frames: frames}:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// process handles this rank's connections and live messages in order until
// ctx ends. Messages of a connection older than the newest one (bind mode:
// an engine dialled in again before its old connection was seen to break)
// are dropped: whatever they carry is either in the replay the new
// connection triggered, or found as a gap.
//
// After IdleCheck without messages it checks the engine's replay buffer
// for batches after the last applied one (checkIdle), and again every
// IdleCheck (longer after checks that changed nothing) while the rank
// stays idle.
func (r *rank) process(ctx context.Context, in <-chan liveMsg) error {
	var idle <-chan time.Time
	var t *time.Timer
	if r.idleEvery = r.s.cfg.IdleCheck; r.idleEvery > 0 {
		t = time.NewTimer(r.idleEvery)
		defer t.Stop()
		idle = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-in:
			switch {
			case m.connect:
				r.onConnect(ctx, m.conn)
			case m.conn < r.conn:
				r.log.Debug("message of a replaced connection dropped", "conn", m.conn, "newest", r.conn)
			default:
				r.onLive(ctx, m.frames)
			}
		case <-idle:
			r.checkIdle(ctx)
		case <-r.wake:
			if r.behind {
				r.catchUp(ctx)
			}
		}
		if t != nil {
			t.Reset(r.idleEvery)
		}
	}
}

// onLive handles one live message: restart and gap detection, replay, then
// the batch itself. While the rank is behind (the consumer queue was full,
// overflow.go) the batch is caught up by replay once the queue has room, or
// counted as dropped.
func (r *rank) onLive(ctx context.Context, frames [][]byte) {
	seq, payload, err := parseLive(frames, r.s.cfg.Topic)
	if err != nil {
		r.count(&r.s.stats.malformed, r.m.malformed)
		r.log.Warn("malformed live message skipped", "err", err)
		return
	}
	st := r.seq.live(seq)
	if st.restart {
		r.count(&r.s.stats.restarts, r.m.restarts)
		r.setBehind(false)
		r.dropHW = 0
		r.setPending(ResetRestart)
		r.log.Warn("engine restart detected: sequence went backwards, dropping its state", "seq", seq)
	}
	if r.behind && !st.dup {
		if r.roomy() {
			r.catchUp(ctx)
		}
		if r.behind {
			r.dropped(seq)
			return
		}
		st = r.seq.step(seq)
	}
	if st.dup {
		r.count(&r.s.stats.duplicates, r.m.duplicates)
		return
	}
	if st.missing {
		if !st.fresh {
			r.count(&r.s.stats.gaps, r.m.gaps)
			r.log.Warn("sequence gap", "missing_from", st.missFrom, "missing_to", seq-1)
		}
		r.fill(ctx, st.missFrom, st.fresh)
	}
	r.handle(seq, payload, false)
}

// fill asks the replay endpoint for the batches from `from` on and handles
// them. Whatever it cannot fill is found by handle as a hole. fresh: nothing
// of this epoch is applied yet (a catch-up; a missing prefix loses nothing
// indexed, but it is logged at Info with what was lost). A replay that finds
// the consumer queue full stops there; the rest is caught up when the queue
// drains (overflow.go).
func (r *rank) fill(ctx context.Context, from uint64, fresh bool) {
	if r.replay == nil {
		return
	}
	r.count(&r.s.stats.replays, r.m.replays)
	res, err := r.replay.replay(ctx, from, func(seq uint64, payload []byte) error {
		r.handle(seq, payload, true)
		return r.stopIfBehind()
	})
	if ctx.Err() != nil {
		return
	}
	if err != nil && !errors.Is(err, errQueueFull) {
		r.count(&r.s.stats.replayErrors, r.m.replayErrors)
		r.log.Warn("replay failed", "from", from, "replayed", res.batches, "err", err)
		return
	}
	short := res.batches > 0 && res.first > from
	if short {
		lvl, msg := slog.LevelWarn, "replay could not start at the requested seq (no longer buffered)"
		if fresh {
			// A catch-up (start-up, or a new engine process): nothing
			// indexed is lost, but the engine's blocks stored by the
			// batches before first stay unknown until evicted or reused.
			lvl, msg = slog.LevelInfo, "catch-up replay could not start at the requested seq: older batches are no longer buffered, the blocks they stored stay unknown"
		}
		r.log.Log(ctx, lvl, msg, "requested_seq", from, "first_seq", res.first,
			"lost_batches", res.first-from, "replayed", res.batches)
	}
	switch {
	case err != nil: // errQueueFull
		r.log.Debug("replay stopped: consumer queue full, the rest is caught up when it drains", "from", from, "replayed", res.batches)
	case res.batches == 0:
		r.log.Debug("replay: nothing buffered from the requested seq on", "from", from, "filtered", res.filtered)
	case !short:
		r.log.Info("replay done", "from", from, "to", res.last, "replayed", res.batches)
	}
}

// handle applies one batch (live or replayed) in sequence order: skips
// batches already applied, turns holes into a pending reset, decodes,
// queues the Update, and counts what was handed on. A batch that finds the
// queue full is not applied (queueFull, overflow.go).
func (r *rank) handle(seq uint64, payload []byte, replayed bool) {
	if r.seq.haveApplied && seq <= r.seq.applied {
		if !replayed {
			r.count(&r.s.stats.duplicates, r.m.duplicates)
		}
		return
	}
	if r.behind {
		r.dropped(seq)
		return
	}
	want := r.seq.next()
	hole := r.seq.haveApplied && seq > want
	b, err := vllm.DecodeBatch(payload)
	if err != nil {
		// Lost for good (a replay returns the same bytes): skipped as
		// applied, and the rank's state dropped.
		r.accept(seq, xxh3.Hash(payload))
		if hole {
			r.holeLost(want, seq)
		}
		r.count(&r.s.stats.malformed, r.m.malformed)
		r.setPending(ResetGapLost)
		r.log.Warn("undecodable batch, dropping this rank's state", "seq", seq, "err", err)
		return
	}
	reset := r.pending
	if hole && reset == ResetNone {
		reset = ResetGapLost
	}
	sum := xxh3.Hash(payload)
	if !r.deliver(Update{Engine: r.s.cfg.Engine, Rank: r.idx, Seq: seq, Sum: sum, Replayed: replayed, Reset: reset, Batch: b}) {
		r.queueFull(seq, payload, want, hole)
		return
	}
	if hole {
		r.holeLost(want, seq)
	}
	r.accept(seq, sum)
	if replayed && seq < r.dropHW {
		r.count(&r.s.stats.queueRecovered, r.m.queueRecovered)
	}
	r.count(&r.s.stats.batches, r.m.batches)
	var stored, removed uint64
	for i := range b.Events {
		switch b.Events[i].Type {
		case vllm.BlockStored:
			stored += uint64(len(b.Events[i].BlockHashes))
			r.m.stored.Inc()
		case vllm.BlockRemoved:
			removed += uint64(len(b.Events[i].BlockHashes))
			r.m.removed.Inc()
		case vllm.AllBlocksCleared:
			r.m.cleared.Inc()
		}
	}
	r.s.stats.events.Add(uint64(len(b.Events)))
	r.s.stats.blocksStored.Add(stored)
	r.s.stats.blocksRemoved.Add(removed)
	r.m.blocksStored.Add(float64(stored))
	r.m.blocksRemoved.Add(float64(removed))
	if !replayed {
		r.m.lag.Observe(max(lagSeconds(r.s.cfg.Now(), b.TS), 0))
	}
}

// accept records seq as applied, with sum, the XXH3 of its payload, for
// the reconnection and idle checks.
func (r *rank) accept(seq uint64, sum uint64) {
	r.seq.accept(seq)
	r.lastSum = sum
}

// holeLost counts and reports batches want..seq-1 as lost for good; the
// caller makes the rank's next Update carry a reset.
func (r *rank) holeLost(want, seq uint64) {
	r.count(&r.s.stats.unrecoverable, r.m.unrecoverable)
	r.log.Warn("unrecoverable gap: batches lost, dropping this rank's state",
		"missing_from", want, "missing_to", seq-1)
}

// deliver queues u without blocking and reports whether it fit. The reset
// pending for the rank travels in u (the caller set u.Reset) and is cleared
// when u is queued.
func (r *rank) deliver(u Update) bool {
	select {
	case r.s.queue <- u:
		r.pending = ResetNone
		return true
	default:
		return false
	}
}

// setPending records a reset for the next Update; the first reason wins
// (they all mean the same to the consumer).
func (r *rank) setPending(why ResetReason) {
	if r.pending == ResetNone {
		r.pending = why
	}
}

// frameLimit bounds the messages of one of this rank's connections
// (socket: "events" or "replay") by SubscriberConfig.MaxMessageBytes; a
// peer that exceeds it is counted in oversized_messages and logged, and
// its connection closed (the dial or accept loop then goes on as after any
// broken connection, a replay fails).
func (r *rank) frameLimit(socket string) frameLimit {
	return frameLimit{max: r.s.cfg.MaxMessageBytes, refused: func(remote string, err error) {
		// Log before counting: whoever sees the count may rely on the line.
		r.log.Warn("engine connection closed: ZMTP message too large", "socket", socket, "remote", remote,
			"max_message_bytes", r.s.cfg.MaxMessageBytes, "err", err)
		r.count(&r.s.stats.oversized, r.m.oversized)
	}}
}

func (r *rank) count(a *atomic.Uint64, c interface{ Inc() }) {
	a.Add(1)
	c.Inc()
}

// lagSeconds returns now - ts (seconds since the Unix epoch), subtracting
// whole seconds first so the float64 keeps sub-microsecond precision.
func lagSeconds(now time.Time, ts float64) float64 {
	if math.IsNaN(ts) || math.IsInf(ts, 0) || math.Abs(ts) > 1e15 {
		return 0
	}
	sec := math.Floor(ts)
	return float64(now.Unix()-int64(sec)) + float64(now.Nanosecond())/1e9 - (ts - sec)
}

// sleepCtx waits for d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
