// Package fleet keeps the set of engine endpoints (vLLM replicas) kvrouter
// forwards to, and whether each one may receive traffic.
//
// An Endpoint is one engine's HTTP base URL serving one or more models. It is
// up or down. It goes down passively, when the proxy reports a connection
// error or a timeout (at once), a run of 5xx answers
// (Config.EjectAfterServerErrors, default 3) or a run of 429/503
// backpressure answers (Config.EjectAfterBackpressure, default 10), or
// actively, when a GET /health probe fails: at once for a definite failure
// (connection refused, TLS verification, a status other than 200, such as
// vLLM's 503 for a dead engine), after Config.EjectAfterProbeTimeouts
// probes in a row without an answer (default 2). 4xx answers never count
// against an endpoint. A down endpoint comes back after a backoff
// (Config.BackoffBase doubling up to Config.BackoffMax, reset after a
// healthy probe) and, when probes are on, only once a probe succeeds.
//
// A stalled endpoint (stall.go) is held out too: one whose request, recorded
// by Endpoint.Await, is overdue (it waited Config.StallAfter, default 1s, or
// twice its predicted time to first token if longer, for its first body
// byte) while the engine showed no sign of life for the stall window: no
// body byte on any request, no scrape whose vLLM work counters moved (a
// hung vLLM core leaves its API server answering /health and /metrics with
// frozen counters). It counts as down for timeouts and is back at its next
// sign of life.
//
// Panic mode (Envoy's panic threshold): when fewer than
// Config.PanicThreshold (default 0.5) of a model's endpoints are up,
// Healthy also returns the ones down for timeouts alone, so a fleet whose
// probes time out under CPU or memory starvation keeps serving by load
// instead of answering "no healthy endpoint" while its engines are alive.
// Endpoints down for a definite failure stay out: traffic sent there would
// certainly fail. The state is the gauge kvrouter_fleet_panic_mode{model}
// and one log line on entering and on leaving it.
//
// Run probes every endpoint's /health (Config.ProbeInterval, jittered per
// endpoint by a hash of its URL so a fleet is not probed in lockstep),
// scrapes its /metrics (Config.ScrapeInterval), handing the parsed vllm:
// gauges to Config.OnMetrics, and lists its GET /v1/models
// (Config.ModelsInterval): a configured model name the engine does not list
// makes the endpoint not ready for it (EndpointState.ModelMissing, the
// gauge kvrouter_fleet_model_not_served, one log line naming the configured
// and the served names), and each card's max_model_len is kept for
// Endpoint.MaxModelLen. Run starts one goroutine per endpoint and loop, and
// one that checks every endpoint for stalls (unless StallAfter is negative),
// and returns only after all of them have returned.
//
// Fleet and Endpoint are safe for concurrent use. Times are seconds of
// wall-clock time from Config.Now.
package fleet
