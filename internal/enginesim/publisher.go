package enginesim

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/go-zeromq/zmq4"
	"golang.org/x/sync/errgroup"

	"kvrouter/internal/vllm"
)

// endSeq is the replay end marker's sequence number.
const endSeq = ^uint64(0)

// pubMsg is one item for the publisher goroutine: a batch, or a control
// message (restart, stall).
type pubMsg struct {
	batch vllm.Batch
	// size is the batch's estimate counted in publisher.queued.
	size    int64
	restart bool
	stall   time.Duration
	// reopened, if not nil, gets the restart's outcome once the new
	// sockets are bound (buffered, capacity 1).
	reopened chan<- error
}

// publisher is vLLM's ZmqEventPublisher: batches queued by the engine loop
// get consecutive sequence numbers from 0, are kept in a replay buffer and
// sent on a PUB socket as [topic, seq8, payload]; a ROUTER socket answers
// replay requests. The queue and the replay buffer are bounded in batches
// (vLLM's max_queue_size and buffer_steps) and in bytes (engine-sim's
// QueueBytes and BufferBytes), so long prompts cannot grow them without
// bound. Faults: dropEvery drops every k-th batch after
// buffering it (as the HWM does), stall pauses sending, restart closes the
// sockets and opens new ones on the same endpoints with an empty buffer
// and the sequence from 0 (a new engine process).
type publisher struct {
	cfg       KVEventsConfig // endpoints already offset for the rank
	layout    vllm.Layout
	oldReplay bool
	dropEvery int
	clock     Clock
	log       *slog.Logger
	m         *metrics

	in chan pubMsg
	// queued is the estimated size of the batches in in (batchMemSize).
	queued atomic.Int64
	// stopped is closed when Run returns.
	stopped chan struct{}

	mu  sync.Mutex // guards buf and next (read by the replay goroutine)
	buf replayBuffer
	// next is the sequence number of the next batch.
	next uint64

	// ready is closed once the first sockets are listening.
	ready chan struct{}
	// addr and replayAddr are the bound endpoints, set before ready closes.
	addr, replayAddr string
	// pubListen and replayListen are the endpoints to bind again at a
	// restart ("" until bound; only open touches them).
	pubListen, replayListen string
	// opened is set by the first open.
	opened bool
}

func newPublisher(cfg KVEventsConfig, rank int, legacy bool, dropEvery int, clock Clock, log *slog.Logger, m *metrics) (*publisher, error) {
	var err error
	if cfg.Endpoint, err = offsetEndpoint(cfg.Endpoint, rank); err != nil {
		return nil, err
	}
	if cfg.ReplayEndpoint, err = offsetEndpoint(cfg.ReplayEndpoint, rank); err != nil {
		return nil, err
	}
	p := &publisher{
		cfg: cfg, oldReplay: legacy, dropEvery: dropEvery, clock: clock, log: log, m: m,
		in:    make(chan pubMsg, cfg.MaxQueueSize),
		ready: make(chan struct{}), stopped: make(chan struct{}),
		buf: replayBuffer{maxItems: cfg.BufferSteps, maxBytes: cfg.BufferBytes},
	}
	if legacy {
		p.layout = vllm.LayoutArray
	}
	return p, nil
}

// publish queues a batch without blocking; a full queue (MaxQueueSize
// batches, or QueueBytes) drops it (counted) before it gets a sequence
// number, as vLLM's queue.put_nowait.
func (p *publisher) publish(b vllm.Batch) {
	size := batchMemSize(&b)
	if p.queued.Add(size) <= p.cfg.QueueBytes {
		select {
		case p.in <- pubMsg{batch: b, size: size}:
			return
		default:
		}
	}
	p.queued.Add(-size)
	p.m.eventsDropped.WithLabelValues("queue_full").Inc()
}

// batchMemSize estimates the memory a queued batch keeps alive: its event
// structs and the token ids, block hashes and extra keys they reference.
// The token ids alias the engine's sequences (a long prompt's chunks share
// one array), so this counts what the batch references, not what it pins.
func batchMemSize(b *vllm.Batch) int64 {
	n := int64(unsafe.Sizeof(*b))
	for i := range b.Events {
		e := &b.Events[i]
		n += int64(unsafe.Sizeof(*e)) + 4*int64(len(e.TokenIDs)) + 8*int64(len(e.BlockHashes)) +
			int64(unsafe.Sizeof([]any(nil)))*int64(len(e.ExtraKeys))
	}
	return n
}

// control queues a restart or stall behind the batches already queued.
func (p *publisher) control(ctx context.Context, m pubMsg) error {
	select {
	case p.in <- m:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// sockets are one engine incarnation's PUB and replay ROUTER. A simulated
// restart closes them (subscribers see their connections drop, as when a
// vLLM process exits) and opens new ones on the same endpoints.
type sockets struct {
	ctx    context.Context // the sockets' context, cancelled by close
	cancel context.CancelFunc
	pub    zmq4.Socket
	router zmq4.Socket // nil without replay
}

// close cancels the sockets' context and closes them. zmq4 v0.17's PUB
// Close leaves its writer goroutine behind (see main_test.go), one per
// incarnation.
func (s *sockets) close() {
	s.cancel()
	s.pub.Close()
	if s.router != nil {
		s.router.Close()
	}
}

// open makes and binds one incarnation's sockets: the PUB (bound by vLLM's
// rule or Bind; otherwise dialled later by Run) and the replay ROUTER. The
// first call binds the configured endpoints and records the bound ones
// (a tcp port 0 resolved), later calls (restarts) bind those again, so a
// restarted engine is found on the same ports. A stale ipc socket file (a
// killed process's) is removed first, as libzmq does.
func (p *publisher) open(ctx context.Context) (_ *sockets, err error) {
	sctx, cancel := context.WithCancel(ctx)
	s := &sockets{ctx: sctx, cancel: cancel, pub: zmq4.NewPub(sctx, p.pubOptions()...)}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if err := s.pub.SetOption(zmq4.OptionHWM, p.cfg.HWM); err != nil {
		return nil, fmt.Errorf("kv events: set hwm: %w", err)
	}
	if p.cfg.bindPub() {
		ep := p.pubListen
		if ep == "" {
			ep = p.cfg.Endpoint
		}
		if ep, err = listen(s.pub, ep); err != nil {
			return nil, fmt.Errorf("kv events: bind %s: %w", p.cfg.Endpoint, err)
		}
		p.pubListen = ep
	}
	if p.cfg.ReplayEndpoint != "" {
		s.router = zmq4.NewRouter(sctx, zmq4.WithID(zmq4.SocketIdentity("enginesim-replay")))
		ep := p.replayListen
		if ep == "" {
			ep = p.cfg.ReplayEndpoint
		}
		if ep, err = listen(s.router, ep); err != nil {
			return nil, fmt.Errorf("kv events: bind replay %s: %w", p.cfg.ReplayEndpoint, err)
		}
		p.replayListen = ep
	}
	if !p.opened {
		p.opened = true
		p.addr, p.replayAddr = p.pubListen, p.replayListen
		close(p.ready)
	}
	return s, nil
}

// listen binds sck on a ZeroMQ endpoint, removing a stale ipc socket file
// first, and returns the bound endpoint (tcp with the port chosen for 0).
func listen(sck zmq4.Socket, ep string) (string, error) {
	if err := removeStaleIPC(ep); err != nil {
		return "", err
	}
	if err := sck.Listen(goEndpoint(ep)); err != nil {
		return "", err
	}
	if strings.HasPrefix(ep, "tcp://") {
		return "tcp://" + sck.Addr().String(), nil
	}
	return ep, nil
}

// Run publishes until ctx ends, on the sockets s made by open and, after
// every simulated restart, on new ones. It closes the sockets it was given.
func (p *publisher) Run(ctx context.Context, s *sockets) error {
	defer close(p.stopped)
	for {
		restart, err := p.session(s)
		if err != nil || restart == nil || ctx.Err() != nil {
			return err
		}
		// A new engine process: empty replay buffer, seq from 0.
		p.mu.Lock()
		p.buf.reset()
		p.next = 0
		p.mu.Unlock()
		s, err = p.open(ctx)
		if err != nil {
			err = fmt.Errorf("kv events: restart: %w", err)
		}
		if restart.reopened != nil {
			restart.reopened <- err
		}
		if err != nil {
			return err
		}
		p.log.Info("kv events: restarted, sockets re-opened", "endpoint", p.cfg.Endpoint, "replay_endpoint", p.cfg.ReplayEndpoint)
	}
}

// session serves one incarnation's sockets until ctx ends (nil) or a
// restart message (returned), then closes them after its goroutines
// returned.
func (p *publisher) session(s *sockets) (restart *pubMsg, err error) {
	g, gctx := errgroup.WithContext(s.ctx)
	defer s.close()
	if !p.cfg.bindPub() {
		g.Go(func() error {
			return recoverErr("kv events dial", func() error {
				if err := s.pub.Dial(p.cfg.Endpoint); err != nil && gctx.Err() == nil {
					p.log.Warn("kv events: connect failed", "endpoint", p.cfg.Endpoint, "err", err)
				}
				return nil
			})
		})
	}
	if s.router != nil {
		g.Go(func() error {
			return recoverErr("kv events replay", func() error { return p.serveReplay(gctx, s.router) })
		})
	}
	g.Go(func() error {
		defer s.cancel()
		return recoverErr("kv events publisher", func() error {
			var err error
			restart, err = p.loop(gctx, s.pub)
			return err
		})
	})
	err = g.Wait()
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	if err != nil {
		return nil, err
	}
	return restart, nil
}

// pubOptions are the PUB socket's options. Only a connecting socket
// (vLLM's rule: the endpoint has no "*" or "::") retries and reconnects:
// zmq4's automatic reconnect re-dials the socket's last endpoint whenever a
// peer goes away, which for a bound socket is its own listen address, and
// that dial races with Close (a data race inside zmq4 on shutdown).
func (p *publisher) pubOptions() []zmq4.Option {
	if p.cfg.bindPub() {
		return nil
	}
	return []zmq4.Option{zmq4.WithDialerMaxRetries(-1), zmq4.WithDialerRetry(250 * time.Millisecond),
		zmq4.WithAutomaticReconnect(true)}
}

// loop sends queued batches until ctx ends (nil) or a restart message
// (returned). A stall ends with the incarnation.
func (p *publisher) loop(ctx context.Context, pub zmq4.Socket) (restart *pubMsg, err error) {
	var stallUntil time.Time
	var scratch []byte // encoding buffer, reused
	for {
		var m pubMsg
		select {
		case <-ctx.Done():
			return nil, nil
		case m = <-p.in:
			p.queued.Add(-m.size)
		}
		switch {
		case m.restart:
			return &m, nil
		case m.stall > 0:
			stallUntil = p.clock.Now().Add(m.stall)
			continue
		}
		if wait := stallUntil.Sub(p.clock.Now()); wait > 0 {
			select {
			case <-ctx.Done():
				return nil, nil
			case <-p.clock.After(wait):
			}
		}
		scratch, err = vllm.AppendBatch(scratch[:0], &m.batch, p.layout)
		if err != nil {
			return nil, fmt.Errorf("kv events: %w", err)
		}
		// An exact-size copy: AppendBatch sizes its buffer by an upper
		// bound (256 B per event, 5 B per token id), up to ~4x the
		// encoding for a batch of one-block BlockRemoved events, and the
		// replay buffer's byte bound counts len.
		payload := make([]byte, len(scratch))
		copy(payload, scratch)
		if cap(scratch) > 1<<20 && len(scratch) < cap(scratch)/4 {
			scratch = nil // do not keep a rare huge batch's buffer
		}
		p.mu.Lock()
		seq := p.next
		p.next++
		p.buf.push(seq, payload)
		p.mu.Unlock()
		if p.dropEvery > 0 && (seq+1)%uint64(p.dropEvery) == 0 {
			p.m.eventsDropped.WithLabelValues("fault").Inc()
			continue
		}
		var seq8 [8]byte
		binary.BigEndian.PutUint64(seq8[:], seq)
		if err := pub.SendMulti(zmq4.NewMsgFrom([]byte(p.cfg.Topic), seq8[:], payload)); err != nil {
			if ctx.Err() != nil {
				return nil, nil
			}
			p.log.Warn("kv events: send failed", "seq", seq, "err", err)
		}
		p.m.eventBatches.Inc()
	}
}

// serveReplay answers [id, "", start_seq] with every buffered batch whose
// seq >= start_seq, then the end marker; any other request shape is ignored
// without a reply, as vLLM does.
func (p *publisher) serveReplay(ctx context.Context, router zmq4.Socket) error {
	for {
		msg, err := router.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("kv events: replay recv: %w", err)
		}
		f := msg.Frames
		if len(f) != 3 || len(f[1]) != 0 {
			p.log.Warn("kv events: invalid replay request", "frames", len(f))
			continue
		}
		var start uint64
		for _, b := range f[2] { // int.from_bytes(frame, "big"), any length
			start = start<<8 | uint64(b)
		}
		p.mu.Lock()
		items := p.buf.from(nil, start)
		p.mu.Unlock()
		id := f[0]
		for _, it := range items {
			if err := router.Send(p.replayMsg(id, it.seq, it.payload)); err != nil {
				break
			}
		}
		if err := router.Send(p.replayMsg(id, endSeq, []byte{})); err != nil && ctx.Err() == nil {
			// A subscriber that left before its answer (a router that
			// stopped) is not the engine's fault: ZeroMQ drops messages
			// to a departed peer the same way.
			p.log.Debug("kv events: replay send failed", "err", err)
		}
		p.m.replays.Inc()
	}
}

// replayMsg is one reply: [id, "", topic, seq8, payload], or without the
// topic frame for the old form (vLLM before 2026-07); the end marker's
// topic is empty.
func (p *publisher) replayMsg(id []byte, seq uint64, payload []byte) zmq4.Msg {
	seq8 := binary.BigEndian.AppendUint64(nil, seq)
	if p.oldReplay {
		return zmq4.NewMsgFrom(id, []byte{}, seq8, payload)
	}
	topic := []byte(p.cfg.Topic)
	if seq == endSeq {
		topic = []byte{}
	}
	return zmq4.NewMsgFrom(id, []byte{}, topic, seq8, payload)
}
