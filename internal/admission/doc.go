// Package admission is the admission of one inference request to a model
// group's engines: the per-request routing core that both fronts share.
// The HTTP front (package proxy) forwards and relays what it admits; the
// Gateway API Inference Extension endpoint picker (package epp, through
// the Picker) hands the decision to a gateway that forwards it.
//
// A request is parsed (package request), resolved to its model group (by
// name, route alias or LoRA adapter), run through the group's features,
// given the body to forward and tokenized (Core.Admit); then routed, as
// often as its front asks (Core.RouteInput, Core.Decide), after the
// context-length check (Core.TooLong). Errors before routing are
// *request.Error values, which each front answers in its own way. The
// package is named for that step, admitting a request and deciding where
// it goes, and it imports no net/http: it does no forwarding.
//
// Per-request features. A model group's optional behaviours (route
// aliases, LoRA adapters, media limits, response pinning, P/D legs) are
// Feature values registered once per group (Group.Features, built by the
// front). For every request Admit calls each Rewriter first (before any
// check), then each Feature's Admit, which checks the request and may add
// a route stage (Flow.AddRoute). Stages a front runs after admission
// (forwarding, retries, relaying, the log line) are declared by that
// front, where it calls them: the front plugs its stages of each feature
// in from Flow.Plug, which Admit calls once per feature as soon as that
// feature's first stage passed. A new per-request feature is a type in
// the front that owns its behaviour, with Admit (and Rewrite when it
// changes the request before it is checked) for what every front must
// do, and the front's own stage interface for the rest; it is registered
// where the front builds its groups (proxy's newFeatures).
//
// Units: token counts are tokens of the group's tokenizer; durations are
// time.Duration; metric series are package frontmetrics'. A Core and a
// Picker are safe for concurrent use once built; a Flow belongs to one
// request and is not. The package starts no goroutines and holds no
// package-level mutable state.
package admission
