// Package fleet keeps the set of engine endpoints (vLLM replicas) kvrouter
// forwards to, and whether each one may receive traffic.
//
// An Endpoint is one engine's HTTP base URL serving one or more models. It is
// up or down. It goes down passively, when the proxy reports a connection
// error (at once), a run of 5xx answers (Config.EjectAfterServerErrors,
// default 3) or a run of 429/503 backpressure answers
// (Config.EjectAfterBackpressure, default 10), or actively, when a GET
// /health probe fails. 4xx answers never count against an endpoint. A down
// endpoint comes back after a backoff (Config.BackoffBase doubling up to
// Config.BackoffMax, reset after a healthy probe) and, when probes are on,
// only once a probe succeeds.
//
// Run probes every endpoint's /health (Config.ProbeInterval, jittered per
// endpoint by a hash of its URL so a fleet is not probed in lockstep) and
// scrapes its /metrics (Config.ScrapeInterval), handing the parsed vllm:
// gauges to Config.OnMetrics. Run starts one goroutine per endpoint and
// returns only after all of them have returned.
//
// Fleet and Endpoint are safe for concurrent use. Times are seconds of
// wall-clock time from Config.Now.
package fleet
