// Package discovery finds a model group's engines (vLLM replicas) in
// Kubernetes and reports the desired set as complete snapshots.
//
// A Source watches one namespace, either the EndpointSlices
// (discovery.k8s.io/v1) of a Service (label kubernetes.io/service-name) or
// the Pods matching a label selector, with client-go's Reflector: a list,
// then a watch, re-listed at once whenever the watch cannot resume (an API
// server restart, a compacted resource version), plus a periodic resync;
// a failed list or watch is retried within 0.3 s (watcher.go), so changes
// made while the API server was down arrive soon after it is back. Each
// snapshot is rebuilt from the informers' caches, never patched from
// events, so an endpoint deleted while the watch was broken cannot survive
// a re-list (vLLM production-stack #656, "zombie IPs").
//
// An engine's State follows its endpoint conditions: ready gets new
// requests (StateReady); terminating and serving finishes what it has and
// gets nothing new (StateDraining); any other endpoint that is still listed
// (not ready, or terminating and no longer serving) gets nothing new
// (StateNotReady); an endpoint that is no longer listed is absent from the
// snapshot (removed). For Pods the Ready condition stands for serving and a
// deletion timestamp for terminating. An address listed in several
// EndpointSlices (the controller moving it) appears once, in its best
// state.
//
// Per-engine settings (KV events port, replay port, dp_size, topic, API-key
// Secret reference) come from Pod annotations (AnnotationEventsPort and
// the others; docs/kubernetes.md) over config.Discovery.Defaults. With a Service they
// are read only when config.Discovery.PodAnnotations is set, which adds a Pod
// informer (and the RBAC to list and watch Pods). The API key of an engine
// whose settings name a Secret key is read from that Secret (a get, again
// every config.Discovery.SecretRefresh) and reported as Engine.APIKey.
// An engine's disaggregated-serving role (Engine.Role: prefill or decode)
// comes from its Pod's config.Discovery.RoleLabel (llm-d.ai/role by default;
// role.go). Before its informers start, Run checks with a SelfSubjectAccessReview per call
// that the API server will allow what it calls (ErrForbidden otherwise).
//
// Run owns the watches and their goroutines and returns after all of them
// stopped. Snapshots delivers each changed snapshot on a channel of
// capacity one: a snapshot not yet received is replaced by the newer one,
// so a slow consumer sees the latest state and never blocks the watch.
// docs/kubernetes.md gives the RBAC, the annotations and measured latency.
package discovery
