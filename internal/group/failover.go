package group

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"

	"kvrouter/internal/kvindex"
)

// ErrNoTokenizerEngine is returned (wrapped) by FailoverTokenizer when no
// engine of the model could tokenize a request: the request is routed by
// load (and the HTTP front counts it in
// kvrouter_proxy_tokenizer_unavailable_total).
var ErrNoTokenizerEngine = errors.New("no engine could tokenize")

// Engine is what a FailoverTokenizer needs of an engine: its name, for
// errors and Remove, and whether it is up (a fleet.Endpoint).
type Engine interface {
	Name() string
	Up() bool
}

// EngineTokenizer is one engine's tokenizer: its render endpoints, or a
// local tokenizer that falls back to them.
type EngineTokenizer struct {
	// Endpoint is the engine, for its health (Up).
	Endpoint Engine
	// Tok tokenizes through that engine.
	Tok Tokenizer
}

// FailoverTokenizer tokenizes through the first up engine of a model (in
// configuration order), trying the next up engine after a connection
// error or timeout; an engine's own answer (an HTTP error status) is
// final. When no engine is up it tries the first engine anyway (its state
// may be stale; a local tokenizer needs no engine). It logs a warning when
// tokenization becomes unavailable and an info line when it recovers (once
// per state change). It is safe for concurrent use.
type FailoverTokenizer struct {
	model   string
	engines atomic.Pointer[[]EngineTokenizer] // replaced whole by Add, Remove
	mu      sync.Mutex                        // serializes Add and Remove
	log     *slog.Logger
	down    atomic.Bool
}

var _ MMTokenizer = (*FailoverTokenizer)(nil)

// NewFailoverTokenizer returns a FailoverTokenizer over engines (none yet
// for a group whose engines come from discovery: Add brings them). A nil
// log discards.
func NewFailoverTokenizer(model string, engines []EngineTokenizer, log *slog.Logger) (*FailoverTokenizer, error) {
	for i, e := range engines {
		if e.Endpoint == nil || e.Tok == nil {
			return nil, fmt.Errorf("model %s: tokenizer: engine %d has no endpoint or tokenizer", model, i)
		}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := &FailoverTokenizer{model: model, log: log.With("model", model)}
	list := slices.Clone(engines)
	f.engines.Store(&list)
	return f, nil
}

// Add appends an engine (an engine added to the group while it serves).
func (f *FailoverTokenizer) Add(e EngineTokenizer) error {
	if e.Endpoint == nil || e.Tok == nil {
		return fmt.Errorf("model %s: tokenizer: engine has no endpoint or tokenizer", f.model)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	next := append(slices.Clone(*f.engines.Load()), e)
	f.engines.Store(&next)
	return nil
}

// Remove drops the engine with that endpoint name (gone from the group).
func (f *FailoverTokenizer) Remove(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	next := slices.DeleteFunc(slices.Clone(*f.engines.Load()), func(e EngineTokenizer) bool { return e.Endpoint.Name() == name })
	f.engines.Store(&next)
}

// Tokens implements Tokenizer.
func (f *FailoverTokenizer) Tokens(ctx context.Context, chat bool, body []byte, text string) ([]uint32, error) {
	ids, _, err := f.TokensMM(ctx, chat, body, text)
	return ids, err
}

// TokensMM implements MMTokenizer: Tokens with the prompt's multimodal
// items, from the first engine that answers (TokensMM of its tokenizer).
func (f *FailoverTokenizer) TokensMM(ctx context.Context, chat bool, body []byte, text string) ([]uint32, []kvindex.MMItem, error) {
	return f.Try(ctx, func(tok Tokenizer) ([]uint32, []kvindex.MMItem, error) {
		return TokensMM(ctx, tok, chat, body, text)
	})
}

// Try runs tokens on the engines' tokenizers in failover order (the
// first up engine, the next one after a connection error or timeout, the
// first engine when none is up) and returns the first answer; an engine's
// own error answer is final. With no engine able to answer the error
// wraps ErrNoTokenizerEngine. Callers use it for the ways of tokenizing
// that Tokens and TokensMM do not cover (a chat request decoded already).
func (f *FailoverTokenizer) Try(ctx context.Context, tokens func(Tokenizer) ([]uint32, []kvindex.MMItem, error)) ([]uint32, []kvindex.MMItem, error) {
	var errs []error
	tried := 0
	engines := *f.engines.Load()
	for _, e := range engines {
		if !e.Endpoint.Up() {
			continue
		}
		tried++
		ids, mm, err := tokens(e.Tok)
		if err == nil {
			f.recovered()
			return ids, mm, nil
		}
		if !connError(ctx, err) {
			return nil, nil, err // the engine answered, or the request is at fault
		}
		errs = append(errs, fmt.Errorf("%s: %w", e.Endpoint.Name(), err))
	}
	if tried == 0 && len(engines) > 0 {
		e := engines[0]
		ids, mm, err := tokens(e.Tok)
		if err == nil {
			f.recovered()
			return ids, mm, nil
		}
		if !connError(ctx, err) {
			return nil, nil, err
		}
		errs = append(errs, fmt.Errorf("%s (down): %w", e.Endpoint.Name(), err))
	}
	err := fmt.Errorf("model %s: %w: %w", f.model, ErrNoTokenizerEngine, errors.Join(errs...))
	if ctx.Err() == nil && !f.down.Swap(true) {
		f.log.Warn("no engine can tokenize; routing by load until one can", "err", err)
	}
	return nil, nil, err
}

func (f *FailoverTokenizer) recovered() {
	if f.down.Load() && f.down.CompareAndSwap(true, false) {
		f.log.Info("an engine tokenizes again; routing by cache")
	}
}

// connError reports whether err means the engine could not be reached (or
// timed out) while ctx, the request's own context, is still alive: worth
// trying another engine.
func connError(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	var ue *url.Error
	return errors.As(err, &ue) || errors.Is(err, context.DeadlineExceeded)
}

// MMTokenizer is met by Tokenizers that also return the prompt's
// multimodal items (identifier and placeholder range, sorted by offset:
// RouteInput.MM).
type MMTokenizer interface {
	Tokenizer
	TokensMM(ctx context.Context, chat bool, body []byte, text string) ([]uint32, []kvindex.MMItem, error)
}

// TokensMM asks tok for the ids and, when it is an MMTokenizer, the items
// (nil otherwise).
func TokensMM(ctx context.Context, tok Tokenizer, chat bool, body []byte, text string) ([]uint32, []kvindex.MMItem, error) {
	if t, ok := tok.(MMTokenizer); ok {
		return t.TokensMM(ctx, chat, body, text)
	}
	ids, err := tok.Tokens(ctx, chat, body, text)
	return ids, nil, err
}
