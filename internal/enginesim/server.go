package enginesim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
)

// Config configures a Server. A zero field means the default in its comment.
type Config struct {
	// Core is the engine core's configuration.
	Core CoreConfig
	// Addr is the HTTP listen address for Run ("0.0.0.0:8000", vLLM's).
	Addr string
	// ServedModelName is the model id clients send and /v1/models lists
	// ("meta-llama/Llama-3.1-8B-Instruct").
	ServedModelName string
	// LoRAModules are adapter names also accepted as model ids; a request
	// naming one carries it as its LoRA name (block extra keys, events).
	LoRAModules []string
	// AllowRuntimeLoRA serves POST /v1/load_lora_adapter (vLLM needs
	// VLLM_ALLOW_RUNTIME_LORA_UPDATING=True for it); off: 404.
	AllowRuntimeLoRA bool
	// LoRALoadDelay is how long loading an adapter at run time takes (0).
	LoRALoadDelay time.Duration
	// MaxLoRAs is --max-loras, reported in vllm:lora_requests_info (1, as
	// vLLM's default); the simulator does not limit batches by it.
	MaxLoRAs int
	// DefaultMaxTokens bounds chat requests without max_tokens (256); vLLM
	// would generate up to max_model_len, which a simulator that never
	// emits EOS should not. Completions default to 16, as in vLLM.
	DefaultMaxTokens int
	// HashAlgo names the block hash for vllm:cache_config_info ("sha256"
	// when NewHasher is set, else "fast").
	HashAlgo string
	// NewHasher makes the block hasher at start and at every restart (a new
	// engine process: without a fixed seed, a new random NONE_HASH). nil
	// means NewFastHasher(Core.HashSeed).
	NewHasher func() (BlockHasher, error)
	// Tokenizer tokenizes prompts and chats; nil means ByteTokenizer.
	Tokenizer Tokenizer
	// KVEvents is --kv-events-config; publishing is off unless enabled.
	KVEvents KVEventsConfig
	// LegacyEvents publishes the array layout of vLLM v0.22-v0.23 and the
	// old replay replies without a topic frame.
	LegacyEvents bool
	// DataParallelRank goes into every batch and offsets the event ports.
	DataParallelRank int
	// DataParallelSize is vllm serve --data-parallel-size: this many engine
	// cores (ranks 0..n-1, each its own cache, scheduler and KV event
	// sockets on port+rank) behind the one HTTP endpoint (1; above 1,
	// DataParallelRank must be 0). See dp.go for how a request finds its rank.
	DataParallelSize int
	// NoPromptTokensDetails leaves usage.prompt_tokens_details out (vLLM's
	// default without --enable-prompt-tokens-details; the simulator shows
	// it by default).
	NoPromptTokensDetails bool
	// MaxBodyBytes bounds request bodies (64 MiB).
	MaxBodyBytes int64
	// Faults are the injected failures.
	Faults Faults
	// Clock is the time source (the wall clock).
	Clock Clock
	// PD is the KV connector of disaggregated serving (pdserver.go); its
	// zero value is none.
	PD PDConfig
	// ResponsesStore keeps /v1/responses answers asked to be stored, for
	// previous_response_id (vLLM: VLLM_ENABLE_RESPONSES_API_STORE=1; off,
	// store is ignored). See responses.go.
	ResponsesStore bool
	// ShutdownTimeout is vllm serve --shutdown-timeout: when Serve's ctx
	// ends, the listener closes at once (new connections are refused),
	// requests arriving on open connections get 503, and the requests in
	// flight run to their end for up to this long; those still running
	// then are aborted (their streams end without [DONE]). 0, vLLM's
	// default, aborts them at once (vLLM's "abort" mode,
	// vllm/entrypoints/launchers/launcher.py handle_shutdown).
	ShutdownTimeout time.Duration
}

// Server is a simulated vLLM engine: the OpenAI HTTP API, /metrics, and the
// KV-event publisher around one Core, stepped in real time by one owner
// goroutine. New starts nothing; Run (or Serve) starts the HTTP server, the
// engine loop and the publisher and returns after all have stopped. Its
// methods are safe for concurrent use.
type Server struct {
	cfg     Config
	coreCfg CoreConfig // with defaults
	log     *slog.Logger
	reg     prometheus.Registerer
	m       *metrics
	state   atomic.Pointer[snapshot]
	eng     *engine
	pub     *publisher
	dice    *dice
	words   textOf
	tok     Tokenizer
	mux     *http.ServeMux
	created int64
	// ranks are the data-parallel ranks behind this endpoint, this server
	// first (nil with one rank): each serves its requests on its own engine.
	ranks []*Server
	// loras are the adapters served, shared by the ranks.
	loras *loraSet
	pd    *pdState // nil without a KV connector
	// store holds stored responses (responses.go); rank 0's serves all.
	store responsesStore
}

// New checks cfg (all problems at once) and builds a Server. A nil log
// discards; metrics go to reg (vLLM's names; use a private registry).
func New(cfg Config, log *slog.Logger, reg prometheus.Registerer) (*Server, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Addr == "" {
		cfg.Addr = "0.0.0.0:8000"
	}
	if cfg.ServedModelName == "" {
		cfg.ServedModelName = "meta-llama/Llama-3.1-8B-Instruct"
	}
	if cfg.DefaultMaxTokens == 0 {
		cfg.DefaultMaxTokens = 256
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = 64 << 20
	}
	if cfg.HashAlgo == "" {
		cfg.HashAlgo = "fast"
		if cfg.NewHasher != nil {
			cfg.HashAlgo = "sha256"
		}
	}
	if cfg.Clock == nil {
		cfg.Clock = wallClock{}
	}
	if cfg.Tokenizer == nil {
		cfg.Tokenizer = ByteTokenizer{}
	}
	var errs []error
	faults, err := cfg.Faults.withDefaults()
	errs = append(errs, err)
	kv, err := cfg.KVEvents.withDefaults()
	errs = append(errs, err)
	coreCfg, err := cfg.Core.withDefaults()
	if err != nil {
		errs = append(errs, fmt.Errorf("core config: %w", err))
	}
	pds, err := cfg.PD.resolve(cfg.DataParallelRank)
	errs = append(errs, err)
	if cfg.DefaultMaxTokens < 1 || cfg.DataParallelRank < 0 {
		errs = append(errs, errors.New("default max tokens must be positive and the data-parallel rank non-negative"))
	}
	if cfg.DataParallelSize < 0 || cfg.DataParallelSize > 1 && cfg.DataParallelRank != 0 || cfg.DataParallelSize > 64 {
		errs = append(errs, fmt.Errorf("data-parallel size %d with rank %d: want a size of 1..64, rank 0 when above 1", cfg.DataParallelSize, cfg.DataParallelRank))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("enginesim: %w", err)
	}
	s := &Server{
		cfg: cfg, coreCfg: coreCfg, log: log, reg: reg, dice: newDice(faults.Seed), words: newTextOf(),
		tok: cfg.Tokenizer, created: cfg.Clock.Now().Unix(), pd: pds,
	}
	s.cfg.Faults, s.cfg.KVEvents = faults, kv
	s.loras = &loraSet{names: slices.Clone(cfg.LoRAModules)}
	if s.cfg.MaxLoRAs <= 0 {
		s.cfg.MaxLoRAs = 1
	}
	if s.m, err = newMetrics(reg, cfg.ServedModelName, coreCfg, cfg.HashAlgo, &s.state, cfg.DataParallelRank); err != nil {
		return nil, fmt.Errorf("enginesim: metrics: %w", err)
	}
	if s.cfg.AllowRuntimeLoRA || len(cfg.LoRAModules) > 0 {
		// vLLM exports it when LoRA is enabled (--enable-lora).
		if err := reg.Register(newLoRAInfo(cfg.ServedModelName, cfg.DataParallelRank, s.cfg.MaxLoRAs, s.state.Load, cfg.Clock.Now)); err != nil {
			return nil, fmt.Errorf("enginesim: metrics: %w", err)
		}
	}
	if kv.enabled() {
		s.pub, err = newPublisher(kv, cfg.DataParallelRank, cfg.LegacyEvents, faults.DropEveryKBatches, cfg.Clock, log, s.m)
		if err != nil {
			return nil, fmt.Errorf("enginesim: kv events: %w", err)
		}
	}
	core, err := s.newCore()
	if err != nil {
		return nil, err
	}
	s.eng = &engine{
		newCore: s.newCore, clock: cfg.Clock, faults: faults, pub: s.pub, rank: cfg.DataParallelRank,
		m: s.m, state: &s.state, cmds: make(chan command, 256), done: make(chan struct{}),
		core: core, streams: make(map[string]*stream), pd: pds,
		trackLoRA: cfg.AllowRuntimeLoRA || len(cfg.LoRAModules) > 0,
	}
	s.eng.publishState()
	if err := s.newRanks(log, reg); err != nil {
		return nil, err
	}
	s.routes()
	return s, nil
}

func (s *Server) newCore() (*Core, error) {
	cfg := s.coreCfg
	if s.cfg.NewHasher != nil {
		h, err := s.cfg.NewHasher()
		if err != nil {
			return nil, fmt.Errorf("enginesim: hasher: %w", err)
		}
		cfg.Hasher = h
	}
	return NewCore(cfg)
}

// Handler returns the HTTP API (for tests and embedding; Run serves it).
func (s *Server) Handler() http.Handler { return s.mux }

// Run listens on Config.Addr and serves until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("enginesim: listen: %w", err)
	}
	return s.Serve(ctx, ln)
}

// Serve binds the KV-event sockets, then serves HTTP on ln, runs the
// engine loop and the KV-event publisher, and returns when ctx ends (nil)
// or one of them fails, after all stopped; a bind error returns at once.
// When ctx ends it drains first for up to Config.ShutdownTimeout (drain).
// It closes ln.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	// run carries the engine loops, the publisher and the requests: it
	// ends when one of them fails, or after ctx ends and the drain is over.
	run, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	g, run := errgroup.WithContext(run)
	gate := &drainGate{next: s.mux}
	hs := &http.Server{
		Handler:           gate,
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return run },
	}
	for _, rs := range s.all() {
		if err := rs.start(run, g); err != nil {
			ln.Close()
			stop()
			_ = g.Wait() // the ranks started before this one
			return err
		}
	}
	g.Go(func() error {
		select {
		case <-run.Done(): // a part failed
		case <-ctx.Done():
			if s.cfg.ShutdownTimeout > 0 {
				s.drain(hs, gate)
			}
		}
		stop() // aborts what is still in flight
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := hs.Shutdown(sctx); err != nil {
			return hs.Close()
		}
		return nil
	})
	attrs := []any{"addr", ln.Addr().String(), "model", s.cfg.ServedModelName}
	if s.pub != nil {
		ev := s.pub.addr // bound, with the port chosen for 0
		if ev == "" {
			ev = "connect " + s.pub.cfg.Endpoint
		}
		attrs = append(attrs, "kv_events", ev, "kv_replay", s.pub.replayAddr)
	}
	s.log.Info("engine-sim serving", attrs...)
	g.Go(func() error {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("enginesim: http: %w", err)
		}
		return nil
	})
	return g.Wait()
}

// drain is vLLM's "drain" shutdown mode: the listener closes (new
// connections are refused), requests on open connections get 503, and it
// returns once every request in flight has finished, or after
// Config.ShutdownTimeout, whichever is first. The engine keeps stepping
// meanwhile.
func (s *Server) drain(hs *http.Server, gate *drainGate) {
	gate.draining.Store(true)
	t0 := time.Now()
	s.log.Info("engine-sim draining: new requests refused, requests in flight finish",
		"in_flight", gate.inFlight.Load(), "shutdown_timeout", s.cfg.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		s.log.Warn("engine-sim shutdown timeout: aborting the requests still in flight",
			"in_flight", gate.inFlight.Load(), "after", time.Since(t0).Round(time.Millisecond))
		return
	}
	s.log.Info("engine-sim drained", "after", time.Since(t0).Round(time.Millisecond))
}

// drainGate counts the requests in flight and, once draining, answers
// every new request 503 and closes its connection.
type drainGate struct {
	next     http.Handler
	draining atomic.Bool
	inFlight atomic.Int64
}

func (d *drainGate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if d.draining.Load() {
		w.Header().Set("Connection", "close")
		writeError(w, http.StatusServiceUnavailable, "the server is shutting down")
		return
	}
	d.inFlight.Add(1)
	defer d.inFlight.Add(-1)
	d.next.ServeHTTP(w, r)
}

// start binds the KV-event sockets, then starts the publisher and the
// engine loop in g; a bind error returns at once.
func (s *Server) start(ctx context.Context, g *errgroup.Group) error {
	if s.pub != nil {
		// Bind the event sockets before anything runs, so that "serving"
		// means every socket is bound and a bind error ends Serve at once.
		socks, err := s.pub.open(ctx)
		if err != nil {
			return fmt.Errorf("enginesim: %w", err)
		}
		g.Go(func() error { return recoverErr("publisher", func() error { return s.pub.Run(ctx, socks) }) })
	}
	g.Go(func() error { return recoverErr("engine", func() error { return s.eng.run(ctx) }) })
	return nil
}

// TimingLag returns, summed over this endpoint's data-parallel ranks, the
// modelled duration of the engine steps run so far and the clock time they
// took beyond it. On a machine that keeps pace lag stays a small share of
// modelled; when the engine goroutine waits for a CPU it grows, and the
// engine serves more slowly than its timing profile says.
func (s *Server) TimingLag() (lag, modelled time.Duration) {
	ranks := s.ranks
	if ranks == nil {
		ranks = []*Server{s}
	}
	for _, r := range ranks {
		lag += time.Duration(r.eng.late.Load())
		modelled += time.Duration(r.eng.modelled.Load())
	}
	return lag, modelled
}

// KVEventsAddrs waits until the publisher's sockets are up and returns
// their bound addresses (empty when connecting or without replay).
func (s *Server) KVEventsAddrs(ctx context.Context) (pub, replay string, err error) {
	if s.pub == nil {
		return "", "", errors.New("enginesim: kv events are disabled")
	}
	select {
	case <-s.pub.ready:
		return s.pub.addr, s.pub.replayAddr, nil
	case <-ctx.Done():
		return "", "", ctx.Err()
	}
}

// Restart simulates an engine process restart (POST /admin/restart,
// SIGHUP in the command): in-flight requests are cut off, the cache and the
// counters are empty (and the hasher is made again: a new random NONE_HASH
// without a fixed seed), and the KV-event sockets are closed, dropping
// their connections, and opened again on the same endpoints with an empty
// replay buffer and sequence numbers from 0; no AllBlocksCleared is sent.
// HTTP keeps serving. It returns once the new sockets are bound (the
// publisher first sends the batches queued before the restart, and
// finishes a stall in progress), or when ctx ends. Every data-parallel
// rank restarts.
func (s *Server) Restart(ctx context.Context) error {
	s.store.clear() // a new API server process: an empty responses store
	for _, rs := range s.all() {
		if err := rs.restartRank(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (s *Server) restartRank(ctx context.Context) error {
	var reopened chan error
	if s.pub != nil {
		reopened = make(chan error, 1)
	}
	if err := s.eng.send(ctx, command{restart: true, pubReopened: reopened, reply: make(chan error, 1)}); err != nil || reopened == nil {
		return err
	}
	select {
	case err := <-reopened:
		return err
	case <-s.pub.stopped:
		return errStopped
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ResetPrefixCache is vLLM's /reset_prefix_cache: it clears the cache and
// publishes AllBlocksCleared, or fails while requests hold blocks.
// With several data-parallel ranks it resets each.
func (s *Server) ResetPrefixCache(ctx context.Context) error {
	for _, rs := range s.all() {
		if err := rs.eng.send(ctx, command{reset: true, reply: make(chan error, 1)}); err != nil {
			return err
		}
	}
	return nil
}

// Freeze hangs the engine core of every rank for d (0: thaws it now), as
// a vLLM core stuck in a GPU kernel or collective: no step runs, so no
// token, KV event or metric change comes out, while the HTTP server keeps
// answering /health (200) and /metrics (the values of the moment the core
// froze); generation requests are admitted (streams get their headers)
// and wait. A step in progress finishes after the thaw; a restart thaws.
func (s *Server) Freeze(ctx context.Context, d time.Duration) error {
	for _, rs := range s.all() {
		if err := rs.eng.send(ctx, command{freeze: &d, reply: make(chan error, 1)}); err != nil {
			return err
		}
	}
	return nil
}

// StallEvents pauses KV-event sending for d; batches queue meanwhile.
func (s *Server) StallEvents(ctx context.Context, d time.Duration) error {
	if s.pub == nil {
		return errors.New("enginesim: kv events are disabled")
	}
	return s.pub.control(ctx, pubMsg{stall: d})
}

// recoverErr runs f, turning a panic into an error.
func recoverErr(what string, f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("enginesim: %s panicked: %v", what, r)
		}
	}()
	return f()
}

// newID returns prefix + 32 random hex digits, like vLLM's request ids.
func newID(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}
