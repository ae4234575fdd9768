// Package epp is kvrouter's second front door: a Gateway API Inference
// Extension endpoint picker (EPP). An inference gateway (Envoy Gateway,
// kgateway, Istio, GKE's gateway) asks it, over Envoy's external
// processing protocol (envoy.service.ext_proc.v3.ExternalProcessor, gRPC),
// which Pod of an InferencePool serves each request; the gateway forwards
// the request itself. The request is parsed, tokenized and routed by the
// HTTP front's own routing core (an admission.Picker, from
// proxy.Server.Picker; the contract is package pick): same models, routers, index, policies and
// load leases, so `kvrouter serve` and `kvrouter epp` pick alike.
//
// Protocol: the Endpoint Picker Protocol v1.0.0,
// kubernetes-sigs/gateway-api-inference-extension
// docs/proposals/004-endpoint-picker-protocol/README.md (read at 84436a9):
//   - streaming mode (Envoy's FULL_DUPLEX_STREAMED body mode for request
//     and response; envoy extensions/filters/http/ext_proc/v3
//     processing_mode.proto): request headers, the request body in chunks
//     until end of stream (or the request trailers), then response headers
//     and response body chunks. The server buffers the request body (at
//     most proxy Config.BodyLimit bytes; more is a 413) and answers, in
//     order, the request headers (the pick), then the body as
//     StreamedBodyResponse chunks of at most 62,000 bytes, the last with
//     end_of_stream (the upstream EPP's chunk size, pkg/common/envoy
//     chunking.go: some Envoy builds cap a chunk at 64 KiB).
//   - the pick goes both in the request header x-gateway-destination-endpoint
//     and in the response's dynamic metadata envoy.lb ->
//     x-gateway-destination-endpoint, with one value: "ip:port", the
//     primary first, then the fallbacks for the gateway's retries,
//     comma-separated.
//   - the subset hint, envoy.lb.subset_hint ->
//     x-gateway-destination-endpoint-subset (a list of "ip:port") in the
//     request's metadata_context, limits the candidates; none eligible (or
//     an empty list) is an ImmediateResponse 503; no ready endpoint is a
//     503; a request shed because every candidate is at
//     Config.MaxInFlight is a 429.
//   - the served endpoint, envoy.lb -> x-gateway-destination-endpoint-served
//     in the response's metadata_context, moves the request's lease and
//     predicted blocks when it is not the pick.
//   - gRPC health (grpc.health.v1) with the services "liveness" (the
//     process answers), "readiness" and
//     "envoy.service.ext_proc.v3.ExternalProcessor" (both: Deps.Ready).
//
// The request body is mutated as the HTTP front mutates it
// (vllm_xargs.kv_cache_report_mode = "full" merged in), with the
// Content-Length request header set to the new length, as the upstream
// EPP does (pkg/epp/handlers/request.go at v1.0.0); Envoy drops it in
// this mode unless allow_content_length_header is set. Errors the picker
// makes itself (bad JSON, unknown model, oversize body, no replica, shed,
// a malformed ext_proc sequence) are ImmediateResponses with OpenAI's
// error JSON, the HTTP front's own bodies.
//
// A request is tracked to its end from the response stream: the response
// status (passive health, and blocks predicted for an error answer are
// dropped), the first body byte (prefill ends), usage from the last
// event or the JSON body, an error event, and the end of the response
// body, of the trailers, or of the gRPC stream (client gone, gateway
// reset): the lease is released exactly once on every path.
//
// A Server is safe for concurrent use; it starts goroutines only in Run
// (gRPC's per-stream goroutines), which returns after they have ended.
package epp
