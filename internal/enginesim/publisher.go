package enginesim

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"golang.org/x/sync/errgroup"

	"kvrouter/internal/vllm"
)

// endSeq is the replay end marker's sequence number.
const endSeq = ^uint64(0)

// pubMsg is one item for the publisher goroutine: a batch, or a control
// message (restart, stall).
type pubMsg struct {
	batch   vllm.Batch
	restart bool
	stall   time.Duration
}

// replayItem is one buffered batch.
type replayItem struct {
	seq     uint64
	payload []byte
}

// publisher is vLLM's ZmqEventPublisher: batches queued by the engine loop
// get consecutive sequence numbers from 0, are kept in a replay buffer and
// sent on a PUB socket as [topic, seq8, payload]; a ROUTER socket answers
// replay requests. Faults: dropEvery drops every k-th batch after
// buffering it (as the HWM does), stall pauses sending, restart resets the
// sequence and the buffer (a new engine process).
type publisher struct {
	cfg       KVEventsConfig // endpoints already offset for the rank
	layout    vllm.Layout
	oldReplay bool
	dropEvery int
	clock     Clock
	log       *slog.Logger
	m         *metrics

	in chan pubMsg

	mu  sync.Mutex // guards buf and next (read by the replay goroutine)
	buf []replayItem
	// next is the sequence number of the next batch.
	next uint64

	// ready is closed once the sockets are listening (tests wait on it).
	ready chan struct{}
	// addr and replayAddr are the bound addresses, set before ready closes.
	addr, replayAddr string
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
		ready: make(chan struct{}),
	}
	if legacy {
		p.layout = vllm.LayoutArray
	}
	return p, nil
}

// publish queues a batch without blocking; a full queue drops it (counted)
// before it gets a sequence number, as vLLM's queue.put_nowait.
func (p *publisher) publish(b vllm.Batch) {
	select {
	case p.in <- pubMsg{batch: b}:
	default:
		p.m.eventsDropped.WithLabelValues("queue_full").Inc()
	}
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

// Run owns the sockets until ctx ends.
func (p *publisher) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, gctx := errgroup.WithContext(ctx)
	pub := zmq4.NewPub(gctx, p.pubOptions()...)
	defer pub.Close()
	if err := pub.SetOption(zmq4.OptionHWM, p.cfg.HWM); err != nil {
		return fmt.Errorf("kv events: set hwm: %w", err)
	}
	if p.cfg.bindPub() {
		if err := pub.Listen(goEndpoint(p.cfg.Endpoint)); err != nil {
			return fmt.Errorf("kv events: bind %s: %w", p.cfg.Endpoint, err)
		}
		p.addr = "tcp://" + pub.Addr().String()
	} else {
		g.Go(func() error {
			if err := pub.Dial(p.cfg.Endpoint); err != nil && gctx.Err() == nil {
				p.log.Warn("kv events: connect failed", "endpoint", p.cfg.Endpoint, "err", err)
			}
			return nil
		})
	}
	if p.cfg.ReplayEndpoint != "" {
		router := zmq4.NewRouter(gctx, zmq4.WithID(zmq4.SocketIdentity("enginesim-replay")))
		defer router.Close()
		if err := router.Listen(goEndpoint(p.cfg.ReplayEndpoint)); err != nil {
			return fmt.Errorf("kv events: bind replay %s: %w", p.cfg.ReplayEndpoint, err)
		}
		p.replayAddr = "tcp://" + router.Addr().String()
		g.Go(func() error { return p.serveReplay(gctx, router) })
	}
	close(p.ready)
	g.Go(func() error {
		defer cancel()
		return p.loop(gctx, pub)
	})
	err := g.Wait()
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
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

func (p *publisher) loop(ctx context.Context, pub zmq4.Socket) error {
	var stallUntil time.Time
	for {
		var m pubMsg
		select {
		case <-ctx.Done():
			return nil
		case m = <-p.in:
		}
		switch {
		case m.restart:
			p.mu.Lock()
			p.buf, p.next = p.buf[:0], 0
			p.mu.Unlock()
			continue
		case m.stall > 0:
			stallUntil = p.clock.Now().Add(m.stall)
			continue
		}
		if wait := stallUntil.Sub(p.clock.Now()); wait > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-p.clock.After(wait):
			}
		}
		payload, err := vllm.AppendBatch(nil, &m.batch, p.layout)
		if err != nil {
			return fmt.Errorf("kv events: %w", err)
		}
		p.mu.Lock()
		seq := p.next
		p.next++
		p.buf = append(p.buf, replayItem{seq: seq, payload: payload})
		if len(p.buf) >= 2*p.cfg.BufferSteps { // trim in bulk, amortised O(1)
			p.buf = append(p.buf[:0], p.buf[len(p.buf)-p.cfg.BufferSteps:]...)
		}
		p.mu.Unlock()
		if p.dropEvery > 0 && (seq+1)%uint64(p.dropEvery) == 0 {
			p.m.eventsDropped.WithLabelValues("fault").Inc()
			continue
		}
		var seq8 [8]byte
		binary.BigEndian.PutUint64(seq8[:], seq)
		if err := pub.SendMulti(zmq4.NewMsgFrom([]byte(p.cfg.Topic), seq8[:], payload)); err != nil {
			if ctx.Err() != nil {
				return nil
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
		var items []replayItem
		for _, it := range p.buf[max(0, len(p.buf)-p.cfg.BufferSteps):] {
			if it.seq >= start {
				items = append(items, it)
			}
		}
		p.mu.Unlock()
		id := f[0]
		for _, it := range items {
			if err := router.Send(p.replayMsg(id, it.seq, it.payload)); err != nil {
				break
			}
		}
		if err := router.Send(p.replayMsg(id, endSeq, []byte{})); err != nil && ctx.Err() == nil {
			p.log.Warn("kv events: replay send failed", "err", err)
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
