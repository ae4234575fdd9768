// Package serve is the router application that "kvrouter serve" and
// "kvrouter epp" run: it wires router.yaml's model groups into one process.
// For each group it builds a routing backend (group.Backend), the
// tokenizer (a failover over the engines' token sources, each with its
// mismatch probe), a pool that gives every engine its KV event subscriber
// and token source, and the engines themselves: router.yaml's, or
// Kubernetes discovery's. Around the groups it builds the fleet (health
// probes and /metrics scrapes), the HTTP front (internal/proxy) with its
// /ui page, the reloader of router.yaml, the index snapshot and the
// router-replica peers.
//
// New builds all of it and returns every configuration error at once,
// before anything listens. It starts none of the application's goroutines
// (only the OTLP span exporter's, when the OTEL_* environment asks for
// tracing, which Run or Close flushes and stops); it does ask each engine
// with a local tokenizer once, within 10 s, whether its tokenizer matches.
// Run serves until its context ends, then drains, writes the index
// snapshot and returns once every goroutine it started has returned.
// Readiness (GET /ready and the EPP's) reads the KV event subscribers'
// connection state directly.
//
// Units: durations are time.Duration; the snapshot interval and reload
// poll are router.yaml's and the command line's.
//
// Ownership: an App is used by one goroutine (New, then Run or Close);
// the goroutines Run starts own the fleet, the pools, the reloader and the
// servers. engineParts' maps are guarded by its mutex, taken alone.
package serve
