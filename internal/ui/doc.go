// Package ui serves kvrouter's live fleet page: GET /ui is one
// self-contained HTML page (no external assets) that polls GET /ui/state,
// a JSON snapshot of every model group and engine: up or ejected, probed,
// KV event stream connected, event lag, load (requests running and waiting
// as the engine reports them, in flight and queued prefill tokens as the
// router counts them), KV cache usage, prefix cache hit rate predicted by
// the router and reported by the engine, index entries, decisions per
// policy and replica, and the most recent routing decisions with their
// explain record.
//
// The state is read at request time from the fleet, the router's own
// Prometheus registry (a Gatherer), the engine metrics the fleet scrapes
// (Observe) and the decisions the proxy reports (Record). When an API key
// is configured, both paths need it: as a bearer token, or as the password
// of HTTP basic authentication (the browser asks for it). UI is safe for
// concurrent use and starts no goroutines.
package ui
