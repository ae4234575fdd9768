// Package proxy is kvrouter's HTTP front: an OpenAI-compatible server that
// parses each request, asks a Router which replica should serve it, and
// streams the engine's answer back untouched.
//
// Endpoints: POST /v1/completions and /v1/chat/completions (streaming and
// not, token-id prompts accepted), POST /v1/route (the routing decision
// without forwarding; also any inference request with the header
// x-kvrouter-route-only: 1), GET /v1/models (union of up engines' models),
// GET /health (alive), GET /ready (every model has one engine up, probed
// and, on the event-fed index, with its KV event stream connected; a JSON
// body lists every engine's state; ?full=1 wants every engine), GET
// /metrics (the registry given to Deps).
//
// Request path: package admission (no net/http) admits a request (parse
// with package request, resolve the model group by name, alias or LoRA
// adapter, run the group's features, check, tokenize) and routes it; both
// fronts use the same admission.Core: the HTTP handlers here, which then
// forward and relay, and the endpoint picker (package epp), which gets it
// as an admission.Picker from Server.Picker. Errors before routing are
// request.Error values this package answers in OpenAI's error JSON.
//
// Per-request features (feature.go): route aliases (aliases.go), LoRA
// adapters (adapters.go), media limits (media.go), response pinning
// (responsepin.go) and P/D legs (pd.go) are values registered once per
// model group (newFeatures). Admission runs their stages both fronts
// need (admission.Feature, admission.Rewriter: rewrite, check, the route
// input); the stages only this front runs are declared here
// (frontStages): each feature admission passed plugs its per-request
// hooks into the exchange (engines allowed, a plan before the first
// attempt, the body per engine, which failures are retried, a filter on
// the answer, a step at the end), the way httputil.ReverseProxy takes
// Rewrite and ModifyResponse. The request path (handle.go, forward.go,
// relay.go) calls the hooks and names no feature. A new per-request
// feature is a type in feature.go's style, registered in newFeatures:
// Admit for what both fronts must do, plug for this front's stages.
//
// Forwarding: the body is forwarded as received, except that
// vllm_xargs.kv_cache_report_mode = "full" is merged in (config.Config
// DisableHitReport turns it off) so the engine reports the prefix blocks it
// reused. Responses are copied as they arrive: server-sent events are
// written and flushed one complete event at a time, other bodies are copied
// through a fixed buffer; nothing is held whole. Hop-by-hop headers are
// stripped both ways; x-request-id is taken from the client (or generated)
// and sent to the engine and back; x-kvrouter-replica and
// x-kvrouter-cached-tokens (the predicted prefix-cache hit, in tokens) are
// added.
//
// Reliability: a request is retried on another replica (config.Config Retries,
// default 1) only before any byte has reached the client, and only after a
// connection error or a 429/502/503 answer. After the first byte, an
// engine failure ends a stream with an OpenAI error event and aborts other
// bodies (the client sees a truncated response), so output is never
// duplicated. A 2xx event stream that ends without "data: [DONE]" (an
// engine stopped by SIGTERM closes cleanly) is such a failure too. Each attempt's load lease is released on every exit path.
// A client that disconnects cancels the engine request at once (logged as
// 499). Timeouts: connect, first byte (from sending the request to the
// first body byte), and idle between body chunks. Errors before the first
// byte are answered in OpenAI's error JSON with one vocabulary of types
// (errors.go): 400 invalid_request_error for malformed requests (bad JSON,
// invalid UTF-8, repeated keys, a non-JSON Content-Type, wrong fields), 401
// authentication_error, 404 not_found_error (unknown model or path), 413
// over the body limit, 503 service_unavailable_error with Retry-After when
// no replica is up, 500/502/504 server_error. Messages name replicas by
// their configured name and carry the request id; causes (addresses,
// socket errors) go only to the log line.
//
// Limits (listener.go, body.go, security.go; docs/security.md): header,
// body-idle and keep-alive timeouts, a cap on open connections with a
// reserve for /health and /ready, a per-request body limit and a budget of
// body bytes held at once (503 with Retry-After past it), validated
// response ids, a client's X-Data-Parallel-Rank dropped and its
// kv_transfer_params refused unless config.Config.Clients allows them, /metrics
// behind the API key, and an optional admin listener (RunAdmin) for the
// introspection paths.
//
// Disaggregated prefill and decode (pd.go, docs/pd.md): in a model group
// whose engines have roles, the same handler plans each request (local on
// a decode engine, or a prefill leg on a prefill engine then a decode leg
// with its kv_transfer_params, vLLM's NixlConnector contract) and says
// which in x-kvrouter-path.
//
// Times are seconds; token counts are tokens. A Server is safe for
// concurrent use; it starts goroutines only in Run and RunAdmin (the
// listener and net/http's per-connection goroutines), which return after
// draining.
package proxy
