package tokenizer

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ErrMismatch: the local tokenizer and the engine disagree on a probe.
// Check returns it (inside a *MismatchError) under ReactRefuse.
var ErrMismatch = errors.New("tokenizer mismatch")

// Reaction is what a Probe does when the local ids differ from the engine's.
type Reaction string

// Reactions.
const (
	// ReactRefuse makes Check return the mismatch, so start-up fails. In
	// Run (after start-up) it logs and sets the metric like ReactContinue.
	ReactRefuse Reaction = "refuse"
	// ReactRender switches the Source to the engine's render backend while
	// the mismatch lasts, and back once a probe agrees again.
	ReactRender Reaction = "render"
	// ReactContinue only logs the error and sets the metric.
	ReactContinue Reaction = "continue"
)

// ProbeConfig configures a Probe. A zero field means the default in its
// comment (DefaultProbeConfig fills them in).
type ProbeConfig struct {
	// Engine names the engine in logs and in the kvrouter_tokenizer_mismatch
	// label. Required.
	Engine string `yaml:"engine"`
	// Reaction to a mismatch. Default ReactRender.
	Reaction Reaction `yaml:"reaction"`
	// Interval between probes in Run. Default 10m.
	Interval time.Duration `yaml:"interval"`
}

// DefaultProbeConfig returns cfg with its zero fields set to defaults.
func DefaultProbeConfig(cfg ProbeConfig) ProbeConfig {
	if cfg.Reaction == "" {
		cfg.Reaction = ReactRender
	}
	if cfg.Interval == 0 {
		cfg.Interval = 10 * time.Minute
	}
	return cfg
}

// probeText is the plain-text probe: prose, code, digits, whitespace runs,
// CJK, accents and an emoji, the places where tokenizers most often differ.
const probeText = "Probe 1: The quick brown fox's 12,345 jumps (3.14159)!\n\n" +
	"def f(x):\n\treturn x**2  # café naïve\n" +
	"東京タワーは333メートル。안녕하세요 😀 — “quotes” ...   end"

// probeChat is the chat probe: a system prompt and a user turn, with the
// generation prompt, tokenized the way vLLM tokenizes chats.
var probeChat = ChatRequest{
	Messages:            []byte(`[{"role":"system","content":"You are a terse assistant. Answer in one line."},{"role":"user","content":"What is 17 × 23? Réponds en français, s'il te plaît."}]`),
	AddGenerationPrompt: true,
}

// localTokens is what the probe and Source need from the local tokenizer
// (met by *Local).
type localTokens interface {
	Encode(text string, addSpecialTokens bool) []uint32
	EncodeChat(req ChatRequest) (string, []uint32, error)
	Decode(ids []uint32) string
}

// engineTokens is the engine's /tokenize (met by *Remote).
type engineTokens interface {
	Tokenize(ctx context.Context, prompt string, addSpecialTokens bool) ([]uint32, error)
	TokenizeChat(ctx context.Context, req ChatRequest) ([]uint32, error)
}

// MismatchError describes the first position where a probe's local ids
// differ from the engine's. It unwraps to ErrMismatch.
type MismatchError struct {
	Engine string // ProbeConfig.Engine
	Probe  string // "text" or "chat"
	Index  int    // first differing position
	// Local and Remote are the ids at Index; -1 when that side ended first.
	Local, Remote int64
	// LocalLen and RemoteLen are the lengths of the two id lists.
	LocalLen, RemoteLen int
	// Context is the decoded text of up to 8 agreeing tokens before Index.
	Context string
	// LocalPiece and RemotePiece are the decoded tokens at Index.
	LocalPiece, RemotePiece string
}

// Error says where local and engine ids first differ and shows both.
func (e *MismatchError) Error() string {
	return fmt.Sprintf("tokenizer mismatch with engine %s on the %s probe at token %d (after %q): local %d %q, engine %d %q (lengths %d vs %d)",
		e.Engine, e.Probe, e.Index, e.Context, e.Local, e.LocalPiece, e.Remote, e.RemotePiece, e.LocalLen, e.RemoteLen)
}

// Unwrap returns ErrMismatch.
func (e *MismatchError) Unwrap() error { return ErrMismatch }

// Probe compares the local tokenizer with an engine's /tokenize on a fixed
// text and chat, at start-up (Check) and periodically (Run). It is safe for
// concurrent use; Run is its only goroutine-owning method.
type Probe struct {
	cfg    ProbeConfig
	local  localTokens
	engine engineTokens
	src    *Source
	log    *slog.Logger
	m      *metrics
}

// NewProbe returns a Probe of engine against local. src is the Source that
// ReactRender switches; it may be nil for the other reactions. A nil log
// discards.
func NewProbe(cfg ProbeConfig, local localTokens, engine engineTokens, src *Source, log *slog.Logger, reg prometheus.Registerer) (*Probe, error) {
	cfg = DefaultProbeConfig(cfg)
	var errs []error
	if cfg.Engine == "" {
		errs = append(errs, errors.New("probe: engine name is required"))
	}
	switch cfg.Reaction {
	case ReactRefuse, ReactContinue:
	case ReactRender:
		if src == nil {
			errs = append(errs, errors.New("probe: reaction render needs a Source"))
		}
	default:
		errs = append(errs, fmt.Errorf("probe: reaction %q: want refuse, render or continue", cfg.Reaction))
	}
	if cfg.Interval < 0 {
		errs = append(errs, errors.New("probe: negative interval"))
	}
	if local == nil || engine == nil {
		errs = append(errs, errors.New("probe: local and engine tokenizers are required"))
	}
	m, err := newMetrics(reg)
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Probe{cfg: cfg, local: local, engine: engine, src: src, log: log.With("engine", cfg.Engine), m: m}, nil
}

// Check runs both probes once. It returns a *MismatchError under
// ReactRefuse, a wrapped engine error when the engine could not be asked
// (the metric then keeps its last value), and nil otherwise; a mismatch is
// always logged at Error level and sets kvrouter_tokenizer_mismatch to 1.
func (p *Probe) Check(ctx context.Context) error {
	mm, err := p.compare(ctx)
	if err != nil {
		return fmt.Errorf("probe engine %s: %w", p.cfg.Engine, err)
	}
	gauge := p.m.mismatch.WithLabelValues(p.cfg.Engine)
	if mm == nil {
		gauge.Set(0)
		if p.src != nil && p.src.engineForced.CompareAndSwap(true, false) {
			p.log.Info("local tokenizer agrees with the engine again; tokenizing locally")
		}
		return nil
	}
	gauge.Set(1)
	p.log.Error("local tokenizer disagrees with the engine", "err", mm, "reaction", p.cfg.Reaction)
	switch p.cfg.Reaction {
	case ReactRefuse:
		return mm
	case ReactRender:
		if !p.src.engineForced.Swap(true) {
			p.log.Warn("switching to the engine's render backend")
		}
	}
	return nil
}

// compare returns the first mismatch of the text probe, then the chat
// probe; nil when both agree.
func (p *Probe) compare(ctx context.Context) (*MismatchError, error) {
	remote, err := p.engine.Tokenize(ctx, probeText, true)
	if err != nil {
		return nil, err
	}
	if mm := p.diff("text", p.local.Encode(probeText, true), remote); mm != nil {
		return mm, nil
	}
	_, local, err := p.local.EncodeChat(probeChat)
	if errors.Is(err, ErrNoChatTemplate) {
		p.log.Debug("no chat template; chat probe skipped")
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("local chat probe: %w", err)
	}
	if remote, err = p.engine.TokenizeChat(ctx, probeChat); err != nil {
		return nil, err
	}
	return p.diff("chat", local, remote), nil
}

// diff returns where local and remote first differ, or nil.
func (p *Probe) diff(probe string, local, remote []uint32) *MismatchError {
	i := 0
	for i < len(local) && i < len(remote) && local[i] == remote[i] {
		i++
	}
	if i == len(local) && i == len(remote) {
		return nil
	}
	mm := &MismatchError{Engine: p.cfg.Engine, Probe: probe, Index: i, Local: -1, Remote: -1,
		LocalLen: len(local), RemoteLen: len(remote), Context: p.local.Decode(local[max(0, i-8):i])}
	if i < len(local) {
		mm.Local, mm.LocalPiece = int64(local[i]), p.local.Decode(local[i:i+1])
	}
	if i < len(remote) {
		mm.Remote, mm.RemotePiece = int64(remote[i]), p.local.Decode(remote[i:i+1])
	}
	return mm
}

// Run probes every Interval (the first after an offset in [0, Interval)
// derived from the engine name, so engines do not all probe at once) until
// ctx ends, then returns nil. Failures are logged; they never stop Run.
func (p *Probe) Run(ctx context.Context) error {
	t := time.NewTimer(p.firstDelay())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := p.Check(ctx); err != nil && !errors.Is(err, ErrMismatch) && ctx.Err() == nil {
			p.log.Warn("tokenizer probe failed", "err", err)
		}
		t.Reset(p.cfg.Interval)
	}
}

// Close deletes the engine's kvrouter_tokenizer_mismatch series; call it
// when the engine leaves the fleet (after Run has returned).
func (p *Probe) Close() {
	p.m.mismatch.DeleteLabelValues(p.cfg.Engine)
}

// firstDelay is Run's offset before the first probe: a hash of the engine
// name modulo Interval.
func (p *Probe) firstDelay() time.Duration {
	h := fnv.New64a()
	h.Write([]byte(p.cfg.Engine))
	return time.Duration(h.Sum64() % uint64(p.cfg.Interval))
}

// remoteTokens is the engine's render backend (met by *Remote).
type remoteTokens interface {
	ChatRendered(ctx context.Context, req ChatRequest) (Rendered, error)
	Completion(ctx context.Context, prompt string, addSpecialTokens bool) ([]uint32, error)
}

// Source yields the token ids an engine will see for a prompt: from the
// local tokenizer, or from the engine's render backend when there is no
// local tokenizer, when the local renderer cannot reproduce a request
// (ErrUnsupported, ErrNoChatTemplate), or while a Probe with ReactRender
// has found a mismatch. It is safe for concurrent use.
type Source struct {
	local  localTokens
	remote remoteTokens
	// engineForced is set by a Probe while local and engine disagree.
	engineForced atomic.Bool
}

// NewSource returns a Source over local and remote; either may be nil (not
// both).
func NewSource(local *Local, remote *Remote) (*Source, error) {
	s := &Source{}
	if local != nil {
		s.local = local
	}
	if remote != nil {
		s.remote = remote
	}
	if s.local == nil && s.remote == nil {
		return nil, errors.New("token source: neither a local tokenizer nor an engine")
	}
	return s, nil
}

// UsingEngine reports whether requests currently go to the engine.
func (s *Source) UsingEngine() bool { return s.local == nil || s.engineForced.Load() }

// Chat returns the ids of a chat request, rendered and encoded with
// add_special_tokens=false as vLLM does.
func (s *Source) Chat(ctx context.Context, req ChatRequest) ([]uint32, error) {
	out, err := s.ChatRendered(ctx, req)
	return out.IDs, err
}

// ChatRendered is Chat with the prompt's multimodal items when the engine's
// render endpoint rendered it (Remote.ChatRendered); the local renderer
// reports none (it refuses media parts with ErrUnsupported, so such chats
// go to the engine).
func (s *Source) ChatRendered(ctx context.Context, req ChatRequest) (Rendered, error) {
	if !s.UsingEngine() {
		var out Rendered
		var err error
		if l, ok := s.local.(*Local); ok {
			_, out.IDs, out.Memo, err = l.encodeChat(req)
		} else {
			_, out.IDs, err = s.local.EncodeChat(req)
		}
		if err == nil || s.remote == nil || !(errors.Is(err, ErrUnsupported) || errors.Is(err, ErrNoChatTemplate)) {
			return out, err
		}
	}
	if s.remote == nil {
		return Rendered{}, errors.New("token source: local tokenizer distrusted and no engine render backend")
	}
	return s.remote.ChatRendered(ctx, req)
}

// Completion returns the ids of a completion prompt.
func (s *Source) Completion(ctx context.Context, prompt string, addSpecialTokens bool) ([]uint32, error) {
	if !s.UsingEngine() {
		return s.local.Encode(prompt, addSpecialTokens), nil
	}
	if s.remote == nil {
		return nil, errors.New("token source: local tokenizer distrusted and no engine render backend")
	}
	return s.remote.Completion(ctx, prompt, addSpecialTokens)
}
