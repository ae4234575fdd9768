// Package group is one model group's routing state, shared by kvrouter's
// fronts (the HTTP proxy, the endpoint picker) and free of net/http.
//
// A model group is the set of engines (vLLM replicas) that serve one model
// name. Its Backend owns a prefix-cache index over those engines
// (kvindex.Exact, fed by their KV events through Apply, or kvindex.Approx,
// learning from routing decisions) and a routing.Router over that index; in
// shadow mode (PolicyShadow) it also computes, without following, what the
// kv policy would choose. An engine started with data parallelism is routed
// as one replica per rank, named RankReplica(engine, rank); Decision names
// the engine and carries the rank. Backend learns the engines' block size
// and cache capacity from their scraped /metrics (Observe) and KV events,
// rebuilding index and router for a new block size; it snapshots and
// restores its exact index (Snapshot, Restore, Resume); it holds its place
// among peer routers (SetStripes). Engines join and leave while it serves
// (AddReplica, RemoveReplica).
//
// Also here: the Router interface the fronts call once per attempt
// (RouteInput in, Decision out), the Tokenizer interface and its failover
// over a group's engines (FailoverTokenizer), and the trust kept in each
// engine's index entries from the cached tokens its answers report (Trust).
//
// Units: token counts are tokens; block sizes are tokens per block;
// capacities are KV cache blocks; times are time.Time or seconds.
//
// Ownership and concurrency: the caller owns each Backend (one per model
// group) and feeds it from the fleet's scrapes and the KV event
// subscribers; Backend and FailoverTokenizer are safe for concurrent use,
// Trust is not (its owner serializes). Nothing here starts a goroutine or
// does I/O, except a Tokenizer the caller supplies.
//
// Lock order inside Backend: mu (serializes rebuilds and changes of the
// engine list) before repMu (the engines' reports, data-parallel sizes,
// pending snapshot parts and distrusted set); repMu is never held while
// calling the index or router, and the current generation (index, router,
// block size) is read without a lock through an atomic pointer.
package group
