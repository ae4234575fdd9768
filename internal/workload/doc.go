// Package workload produces the request streams that kvrouter's simulator
// (internal/sim) and live benchmark (internal/bench) replay: the Mooncake
// FAST'25 conversation trace, and synthetic generators for the regimes that
// matter to prefix routing (shared prefix, multi-turn chat, unique prompts,
// one hot prefix).
//
// A Request's prompt is a list of Segments, each a (key, length) pair that
// expands deterministically into token ids (see Segment.AppendTokens): equal
// keys give equal tokens, different keys give different tokens (the first
// four tokens of a segment spell a bijective mix of its key). Prompts are
// therefore cheap to hold (a 12,000-token Mooncake prompt is 24 segments)
// and materialised only when a request is sent.
//
// Arrival times are offsets from the start of a run (time.Duration): from the
// trace's timestamps divided by a speed factor (Mooncake), or a Poisson
// process at a rate drawn from an injected *rand.Rand (Poisson). Everything
// is deterministic for a given seed.
//
// The package is a leaf: it imports only the standard library. Nothing in it
// starts goroutines; values are immutable once built and safe to share
// between goroutines.
package workload
