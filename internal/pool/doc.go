// Package pool keeps one model group's engines in step with what a source
// (router.yaml at start or on reload, Kubernetes discovery) says exists,
// while the router serves.
//
// Set takes the complete desired list of a group's engines. An engine new
// to the pool gets a fleet endpoint, a routing replica (cold: no index
// entries, so it warms through the cost function like any new replica) and
// its parts (a KV event subscriber, a tokenizer source: whatever
// Deps.Parts builds for it); an engine gone from the list loses all of
// them: its parts are stopped and closed, its index entries dropped, its
// endpoint removed (requests in flight on it finish; their leases release
// harmlessly). An engine whose address or event settings changed is
// removed and added again. Engines that are listed but not Routable
// (Kubernetes: not ready, or terminating and still serving) keep
// everything and get no new requests. Other engines are never touched.
//
// Parts run in goroutines owned by Run: those of engines added before Run
// starts wait for it. A part whose Run fails is logged and counted; the
// router and the other engines go on. Pool is safe for concurrent use.
package pool
