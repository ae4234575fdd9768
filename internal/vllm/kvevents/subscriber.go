package kvevents

import (
	"context"
	"errors"
	"fmt"
	"kvrouter/internal/vllm"
	"log/slog"
	"net"
	"runtime/debug"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
)

// The consumer's side of a subscription, defined in package vllm so that
// code consuming Updates (the model group's index) needs no ZeroMQ.
type (
	// ResetReason is vllm.ResetReason.
	ResetReason = vllm.ResetReason
	// Update is vllm.Update.
	Update = vllm.Update
	// Position is vllm.Position.
	Position = vllm.Position
)

// Reset reasons (vllm.ResetNone ...).
const (
	ResetNone      = vllm.ResetNone
	ResetRestart   = vllm.ResetRestart
	ResetGapLost   = vllm.ResetGapLost
	ResetOverflow  = vllm.ResetOverflow
	ResetReconnect = vllm.ResetReconnect
)

// SubscriberConfig configures one Subscriber (one engine, all its
// data-parallel ranks). A zero field means the default in its comment.
type SubscriberConfig struct {
	// Engine names the engine in Updates, logs and metric labels. Default:
	// Endpoint. Must be unique among the subscribers sharing a
	// SubscriberMetrics: a stopping subscriber deletes its engine's series.
	Engine string `yaml:"engine"`
	// Endpoint is the engine's KV event PUB endpoint, "tcp://HOST:PORT"
	// (or "ipc://PATH"). In connect mode (the default, vLLM binds
	// "tcp://*:5557") HOST is the engine's host. In bind mode it is the
	// local address to bind, e.g. "tcp://*:5557". Required.
	Endpoint string `yaml:"endpoint"`
	// ReplayEndpoint is the engine's replay ROUTER, "tcp://HOST:PORT",
	// always dialled. Empty: replay off, every gap is unrecoverable.
	ReplayEndpoint string `yaml:"replay_endpoint"`
	// Topic is the SUB prefix filter (vLLM's "topic", default "": all).
	Topic string `yaml:"topic"`
	// DPSize is the number of data-parallel ranks; rank r is subscribed at
	// Endpoint's port + r and replayed at ReplayEndpoint's port + r.
	// Default 1.
	DPSize int `yaml:"dp_size"`
	// Bind makes the router bind the SUB endpoints and the engines dial in
	// (vLLM connects when its endpoint names a host, not "*").
	Bind bool `yaml:"bind"`
	// MaxConns bounds, in bind mode, the engine connections accepted and
	// open at once per rank (a rank has one engine; a second one appears
	// briefly when an engine dials in again before its old connection is
	// seen to break). A connection accepted beyond it is closed at once and
	// counted (kvrouter_vllm_rejected_conns_total); those already open keep
	// going. Default 4.
	MaxConns int `yaml:"max_conns"`
	// MaxMessageBytes bounds one ZMTP message read from the engine's event,
	// replay or bound port (the sum of its frames' bodies; at most 64
	// frames): a peer whose frame header would exceed it has its
	// connection closed before anything is allocated for the frame, is
	// logged and counted (kvrouter_vllm_oversized_messages_total), and is
	// reconnected to (connect mode) or may dial in again (bind mode).
	// 4096..2^40; default DefaultMaxMessageBytes.
	MaxMessageBytes int64 `yaml:"max_message_bytes"`
	// QueueSize bounds the Updates waiting for the consumer, shared by the
	// engine's ranks: 1..MaxQueueSize. A batch that finds it full is caught
	// up later by replay (see overflow.go). Default DefaultQueueSize.
	QueueSize int `yaml:"queue_size"`
	// ReplayTimeout bounds one replay request, connection included.
	// Default 5s.
	ReplayTimeout time.Duration `yaml:"replay_timeout"`
	// DialTimeout bounds one connection attempt (TCP connect and ZMTP
	// handshake) to an engine. Default 5s.
	DialTimeout time.Duration `yaml:"dial_timeout"`
	// IdleCheck is how long a rank may go without live messages before the
	// subscriber asks the replay endpoint for batches after the last one
	// applied (and again every IdleCheck while idle): the live stream drops
	// batches silently under load, and a drop at the end of a burst is
	// otherwise found only when the engine next publishes. One replay
	// request per idle rank per IdleCheck. Default 5s; negative: off.
	IdleCheck time.Duration `yaml:"idle_check"`
	// ReconnectMin and ReconnectMax bound the exponential backoff between
	// connection attempts in connect mode. Defaults 100ms and 2s.
	ReconnectMin time.Duration `yaml:"reconnect_min"`
	ReconnectMax time.Duration `yaml:"reconnect_max"`
	// Resume gives, per rank, the position of the last batch the consumer
	// applied before it restarted (from a snapshot): the rank starts as if
	// that batch had just been applied, so its first connection asks the
	// engine's replay endpoint for the batches after it (checking that
	// the engine process is the one that published it, else the rank is
	// reset as on a reconnection: restart, or gap lost when the engine no
	// longer buffers it). Ranks not listed start from nothing.
	Resume map[int]Position `yaml:"-"`
	// Now is the clock for lag measurement. Default time.Now.
	Now func() time.Time `yaml:"-"`
}

// Bounds of SubscriberConfig.QueueSize (vllm.DefaultQueueSize,
// vllm.MaxQueueSize).
const (
	DefaultQueueSize = vllm.DefaultQueueSize
	MaxQueueSize     = vllm.MaxQueueSize
)

func (c SubscriberConfig) withDefaults() SubscriberConfig {
	if c.Engine == "" {
		c.Engine = c.Endpoint
	}
	if c.DPSize == 0 {
		c.DPSize = 1
	}
	if c.MaxConns == 0 {
		c.MaxConns = 4
	}
	if c.QueueSize == 0 {
		c.QueueSize = DefaultQueueSize
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.ReplayTimeout == 0 {
		c.ReplayTimeout = 5 * time.Second
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = 5 * time.Second
	}
	if c.IdleCheck == 0 {
		c.IdleCheck = 5 * time.Second
	}
	if c.ReconnectMin == 0 {
		c.ReconnectMin = 100 * time.Millisecond
	}
	if c.ReconnectMax == 0 {
		c.ReconnectMax = 2 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// SubscriberStats are a Subscriber's totals over all ranks since it was
// made; the same quantities as its metrics.
type SubscriberStats struct {
	Batches           uint64 `json:"batches"`
	Events            uint64 `json:"events"`
	BlocksStored      uint64 `json:"blocks_stored"`
	BlocksRemoved     uint64 `json:"blocks_removed"`
	Gaps              uint64 `json:"gaps"`
	Replays           uint64 `json:"replays"`
	ReplayErrors      uint64 `json:"replay_errors"`
	UnrecoverableGaps uint64 `json:"unrecoverable_gaps"`
	Restarts          uint64 `json:"restarts"`
	QueueDrops        uint64 `json:"queue_drops"`
	Malformed         uint64 `json:"malformed"`
	Duplicates        uint64 `json:"duplicates"`
	Reconnects        uint64 `json:"reconnects"`
	RejectedConns     uint64 `json:"rejected_conns,omitempty"` // bind mode; omitted when 0 (kvrouter events output unchanged)
	IdleChecks        uint64 `json:"idle_checks,omitempty"`    // omitted when 0
	// QueueRecovered counts the batches of QueueDrops later handed on by
	// replay; OverflowResets the overflows replay could not cover (each
	// one ResetOverflow). Omitted when 0.
	QueueRecovered uint64 `json:"queue_recovered,omitempty"`
	OverflowResets uint64 `json:"overflow_resets,omitempty"`
	// Oversized counts connections closed because a message exceeded
	// MaxMessageBytes. Omitted when 0.
	Oversized uint64 `json:"oversized_messages,omitempty"`
}

// stats mirrors SubscriberStats with atomics.
type stats struct {
	batches, events, blocksStored, blocksRemoved, gaps, replays, replayErrors,
	unrecoverable, restarts, queueDrops, malformed, duplicates, reconnects, rejectedConns, idleChecks,
	queueRecovered, overflowResets, oversized atomic.Uint64
}

// Subscriber follows one vLLM engine's KV events: one live subscription per
// data-parallel rank, sequence tracking, replay of gaps, restart detection,
// and a bounded queue to the consumer. Make it with NewSubscriber and start
// it with Run, once. Stats and Connected are safe to call concurrently with
// Run.
//
// Run starts, per rank, a connection goroutine (connect mode: dial, read,
// redial; bind mode: accept, plus one reader per accepted engine
// connection) and a processing goroutine that alone owns the rank's
// sequence state and replay connection; and one goroutine calling apply.
type Subscriber struct {
	cfg     SubscriberConfig
	log     *slog.Logger
	m       *SubscriberMetrics
	live    []zmtpEndpoint // per rank
	replay  []*replayer    // per rank; nil when replay is off
	queue   chan Update
	started atomic.Bool
	stats   stats
	// ranks behind after a full queue (overflow.go); the apply goroutine
	// wakes them when the queue has drained to half
	behind atomic.Int32
	// running holds Run's ranks while it runs (nil before and after), for
	// Connected.
	running atomic.Pointer[[]*rank]
}

// NewSubscriber checks cfg and returns a Subscriber; it binds and dials
// nothing and starts no goroutine (Run does). log nil discards logs. m is
// shared by all subscribers of a registry (see NewSubscriberMetrics); nil
// uses unregistered collectors. All configuration problems are returned at
// once.
func NewSubscriber(cfg SubscriberConfig, log *slog.Logger, m *SubscriberMetrics) (*Subscriber, error) {
	cfg = cfg.withDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if m == nil {
		m, _ = NewSubscriberMetrics(nil)
	}
	var errs []error
	if cfg.Endpoint == "" {
		errs = append(errs, errors.New("endpoint is required"))
	}
	if cfg.DPSize < 1 || cfg.DPSize > 1024 {
		errs = append(errs, fmt.Errorf("dp_size %d: want 1..1024", cfg.DPSize))
	}
	if cfg.MaxConns < 1 {
		errs = append(errs, fmt.Errorf("max_conns %d: want >= 1", cfg.MaxConns))
	}
	if cfg.QueueSize < 1 || cfg.QueueSize > MaxQueueSize {
		errs = append(errs, fmt.Errorf("queue_size %d: want 1..%d", cfg.QueueSize, MaxQueueSize))
	}
	if cfg.MaxMessageBytes < MinMaxMessageBytes || cfg.MaxMessageBytes > MaxMaxMessageBytes {
		errs = append(errs, fmt.Errorf("max_message_bytes %d: want %d..%d", cfg.MaxMessageBytes, MinMaxMessageBytes, int64(MaxMaxMessageBytes)))
	}
	if cfg.ReplayTimeout < 0 || cfg.DialTimeout < 0 || cfg.ReconnectMin < 0 || cfg.ReconnectMax < cfg.ReconnectMin {
		errs = append(errs, errors.New("timeouts must be positive and reconnect_max >= reconnect_min"))
	}
	s := &Subscriber{cfg: cfg, log: log.With("engine", cfg.Engine), m: m, queue: make(chan Update, min(max(cfg.QueueSize, 1), MaxQueueSize))}
	for r := 0; cfg.Endpoint != "" && r < cfg.DPSize && r < 1024; r++ {
		ep, err := parseEndpoint(cfg.Endpoint, r, cfg.Bind)
		if err != nil {
			errs = append(errs, err)
			break
		}
		s.live = append(s.live, ep)
		if cfg.ReplayEndpoint == "" {
			s.replay = append(s.replay, nil)
			continue
		}
		rep, err := parseEndpoint(cfg.ReplayEndpoint, r, false)
		if err != nil {
			errs = append(errs, fmt.Errorf("replay %w", err))
			break
		}
		s.replay = append(s.replay, &replayer{ep: rep, timeout: cfg.ReplayTimeout, topic: cfg.Topic})
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("vllm subscriber %q: %w", cfg.Engine, err)
	}
	return s, nil
}

// Run subscribes to every rank and calls apply for each Update, from one
// goroutine, in sequence order per rank, until ctx ends. It returns nil when
// ctx ends, or an error when a bind fails or a goroutine panics (apply
// included); in every case only after all its goroutines have returned and
// its connections are closed, and after deleting its metric label values.
// apply may fall behind for a while: Updates queue up to QueueSize, and the
// batches that find the queue full are fetched again by replay once it has
// drained to half (a rank is reset with ResetOverflow only when the engine no
// longer buffers them, or has no replay endpoint). Run may be called once.
func (s *Subscriber) Run(ctx context.Context, apply func(Update)) error {
	if !s.started.CompareAndSwap(false, true) {
		return fmt.Errorf("vllm subscriber %q: Run called twice", s.cfg.Engine)
	}
	defer s.m.deleteEngine(s.cfg.Engine)
	lns := make([]net.Listener, len(s.live))
	for r := range s.live {
		if !s.cfg.Bind {
			break
		}
		ln, err := listen(ctx, s.live[r])
		if err != nil {
			for _, l := range lns[:r] {
				l.Close()
			}
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("vllm subscriber %q rank %d: %w", s.cfg.Engine, r, err)
		}
		lns[r] = ln
	}
	g, ctx := errgroup.WithContext(ctx)
	ranks := make([]*rank, len(s.live))
	for r := range s.live {
		ranks[r] = s.newRank(r)
		if pos, ok := s.cfg.Resume[r]; ok {
			ranks[r].resume(pos)
		}
	}
	s.running.Store(&ranks)
	defer s.running.Store(nil)
	for r, rs := range ranks {
		in := make(chan liveMsg, 64)
		if ln := lns[r]; ln != nil {
			g.Go(guard("accept", func() error { return rs.acceptLoop(ctx, ln, in) }))
		} else {
			g.Go(guard("dial", func() error { return rs.dialLoop(ctx, in) }))
		}
		g.Go(guard("process", func() error { return rs.process(ctx, in) }))
	}
	g.Go(guard("apply", func() error {
		for {
			select {
			case <-ctx.Done():
				return nil
			case u := <-s.queue:
				apply(u)
				if s.behind.Load() > 0 && len(s.queue) <= s.cfg.QueueSize/2 {
					for _, rs := range ranks {
						if rs.waiting.Load() {
							rs.wakeUp()
						}
					}
				}
			}
		}
	}))
	return g.Wait()
}

// Connected reports whether Run is running with a live event connection
// to every data-parallel rank of the engine (the state the
// kvrouter_vllm_connected gauges show). It is false before Run, after it
// returns, and while any rank is between connections.
func (s *Subscriber) Connected() bool {
	p := s.running.Load()
	if p == nil || len(*p) == 0 {
		return false
	}
	for _, r := range *p {
		if r.conns.Load() <= 0 {
			return false
		}
	}
	return true
}

// Stats returns totals over all ranks since NewSubscriber.
func (s *Subscriber) Stats() SubscriberStats {
	t := &s.stats
	return SubscriberStats{
		Batches: t.batches.Load(), Events: t.events.Load(), BlocksStored: t.blocksStored.Load(),
		BlocksRemoved: t.blocksRemoved.Load(), Gaps: t.gaps.Load(), Replays: t.replays.Load(),
		ReplayErrors: t.replayErrors.Load(), UnrecoverableGaps: t.unrecoverable.Load(),
		Restarts: t.restarts.Load(), QueueDrops: t.queueDrops.Load(), Malformed: t.malformed.Load(),
		Duplicates: t.duplicates.Load(), Reconnects: t.reconnects.Load(), RejectedConns: t.rejectedConns.Load(),
		IdleChecks: t.idleChecks.Load(), QueueRecovered: t.queueRecovered.Load(), OverflowResets: t.overflowResets.Load(),
		Oversized: t.oversized.Load(),
	}
}

// guard turns a panic in f into an error carrying the stack.
func guard(name string, f func() error) func() error {
	return func() (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("vllm subscriber %s goroutine panicked: %v\n%s", name, p, debug.Stack())
			}
		}()
		return f()
	}
}
