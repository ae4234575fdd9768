package group

import (
	"context"
	"time"

	"kvrouter/internal/kvindex"
	"kvrouter/internal/routing"
)

// Router chooses the replica of one request among candidates. A front
// calls it once per attempt (a retry excludes the replicas already tried).
// Implementations must be safe for concurrent use and fast (no I/O).
// Backend is the Router of a model group.
type Router interface {
	Route(in *RouteInput) (Decision, error)
}

// RouteInput is what a front knows of a request when routing it.
type RouteInput struct {
	// Model is the request's model name.
	Model string
	// RequestID is the request's x-request-id (the client's, or the one
	// the router made), for the router's log lines.
	RequestID string
	// Tokens are the prompt's token ids as the engine will see them; nil
	// when unknown (tokenizer "none" with a text prompt, or a tokenizer
	// error): route by load.
	Tokens []uint32
	// Text is the prompt's routing text for prefix_chars (a completion's
	// string prompt, a chat's message contents joined by "\n",
	// routing.TokenText of a token-id prompt: routing.PrefixChars), set only
	// when the Router has a UsesText method that reports true (Backend
	// serving prefix_chars); "" otherwise.
	Text string
	// Session is the first non-empty session header value, or "".
	Session string
	// MaxTokens is the request's max_tokens (or max_completion_tokens), 0
	// when absent: the expected output length for decode load.
	MaxTokens int
	// CacheSalt is the request's cache_salt, or "".
	CacheSalt string
	// LoRA is the LoRA adapter the request names ("" for the base model):
	// an extra key of every block (kvindex.Extras.LoRA).
	LoRA string
	// MM are the prompt's multimodal items (identifier and placeholder
	// range, sorted by offset): extra keys of the blocks they overlap
	// (kvindex.Extras.MM). nil for text prompts.
	MM []kvindex.MMItem
	// KeyMemo keeps the block keys of Tokens' leading blocks between
	// requests (routing.Request.KeyMemo); nil: none. It belongs to
	// Tokens as set: a stage that puts other ids there must clear it.
	KeyMemo routing.KeyMemo
	// PromptTokens is the prompt length in tokens for the prefill cost
	// when Tokens is nil or shorter than the prompt (a media prompt whose
	// items are unknown, routed by load; a prompt whose tokens are
	// unknown, estimated from its body's size; 0: len(Tokens)).
	PromptTokens int
	// Candidates are the names of the replicas that may serve the request,
	// in configuration order; never empty.
	Candidates []string
	// DryRun asks for the decision without recording it (no load lease, no
	// predicted blocks): POST /v1/route.
	DryRun bool
}

// Decision is a Router's answer.
type Decision struct {
	// Replica is the chosen candidate's name.
	Replica string
	// Policy names the policy that chose ("" when the router has none).
	Policy string
	// CachedTokens is the predicted prefix-cache hit on Replica, in tokens.
	CachedTokens int
	// IndexCachedTokens is the hit the index predicts on Replica from what
	// it holds there, whether or not the policy trusted it (trust.go); 0
	// when the router has no index.
	IndexCachedTokens int
	// DPRank, when HasDPRank, is the data-parallel rank of Replica chosen
	// (an engine with dp_size > 1): sent in the X-data-parallel-rank header.
	DPRank    int
	HasDPRank bool
	// Release ends the request's load lease; the front calls it exactly
	// once when the attempt ends (done, error, cancel or retry). Nil when
	// nothing was recorded.
	Release func()
	// Failed, when not nil, is called when the engine answered the attempt
	// with an error (a status other than 2xx, an error event in its
	// stream) or the attempt failed otherwise (connection, timeout, client
	// gone), before Release: the blocks predicted for the request will not
	// be stored and are dropped from the index at once. It may be called
	// more than once.
	Failed func()
	// PredictedTTFT is the time from sending the request to its first
	// token that the routing model predicts on Replica (prefill queued
	// there, this request's uncached tokens included, at its prefill rate:
	// routing.Lease.PredictedTTFT); 0 when unknown. The fleet's stall
	// detector waits a multiple of it.
	PredictedTTFT time.Duration
	// FirstToken, when not nil, is called once when the first response
	// byte from the engine reaches the client (the request moves from
	// prefill to decode in the load model).
	FirstToken func()
	// Shadow, when not nil, is what the shadow policy would have chosen
	// (policy shadow): exported as metrics, never acted on.
	Shadow *ShadowDecision
	// Explain is the record of why, marshalled as JSON by POST /v1/route:
	// per-candidate cached blocks and cost.
	Explain any
}

// ShadowDecision is the compared policy's choice in shadow mode; POST
// /v1/route shows it as "shadow": {"replica", "cached_tokens"}.
type ShadowDecision struct {
	// Replica the shadow policy would have chosen ("" when none).
	Replica string `json:"replica"`
	// CachedTokens it would have found cached there, in tokens.
	CachedTokens int `json:"cached_tokens"`
}

// Tokenizer turns a request into the token ids the engine will compute.
// chat tells a /v1/chat/completions body from a /v1/completions body; text
// is a completion's (first) string prompt. It may do I/O (an engine's
// render endpoint), bounded by ctx.
type Tokenizer interface {
	Tokens(ctx context.Context, chat bool, body []byte, text string) ([]uint32, error)
}
