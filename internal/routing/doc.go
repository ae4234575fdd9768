// Package routing chooses the replica that serves a request: it combines the
// KV block index (how many leading blocks of the prompt each replica holds),
// per-replica load, and a Policy, and records each decision's effect on load
// and on the index.
//
// # Model
//
// A Router serves one key space (model and pool) of replicas named by the
// caller (engine name or URL). Route(req) does, without blocking or I/O:
//  1. req.Tokens are chained into block keys (kvindex.Keys, with the index's
//     root and block size), unless req.Keys is set;
//  2. the index's Lookup gives each replica's kvindex.Match: leading blocks
//     on GPU, predicted, CPU and STORAGE;
//  3. each healthy replica becomes a Candidate with its Load: in-flight
//     requests, queued prefill tokens (uncached prompt tokens of requests
//     before their first token), running decode tokens (expected output tokens
//     of requests past it), active tokens (prompt + output of all in-flight
//     requests), and the engine's scraped gauges (waiting, running, KV usage;
//     zero when older than Config.GaugeMaxAge);
//  4. the Policy picks one Candidate and returns a Decision: the choice and
//     each candidate's Terms (cached blocks, cost in the policy's unit), the
//     record of why;
//  5. the chosen replica is charged: Index.Routed (prediction or approximate
//     insert; kvindex.Exact.RoutedMatch with the chosen Match when the index
//     has it, sparing a second walk of the prompt) and a Lease that holds the
//     request's load until Release.
//
// Evaluate(req, p) does steps 1–4 only, with the router's policy or any
// other (p, e.g. a shadow kv made by Router.NewPolicy), and records nothing:
// no lease, no prediction, no metrics, no policy state (Evaluator: no
// round-robin step, no trie insert, no random draw; a random tie-break
// becomes a deterministic one, see Evaluator). It serves explanations (what would Route do
// now, and why) and shadow policies (what would kv have chosen, and how much
// would it have found cached) with exactly Route's keys, lookup and loads.
//
// Load is changed only by leases: Lease.FirstToken moves a request from
// queued prefill to running decode, Lease.Release removes it; both are
// idempotent, and a release that would make a counter negative is counted
// (kvrouter_routing_lease_underflow_total) and clamped. Nothing is reset on a
// timer. Callers must `defer lease.Release()` on every exit path (done, error,
// client gone, retry elsewhere).
//
// # Policies
//
// kv (the default) costs each replica in seconds of time to first token:
//
//	overlap  = gpu + 0.75*cpu + 0.25*storage + 1*predicted        (blocks)
//	backlog  = queued_prefill/prefill_rate + waiting_penalty*waiting (s)
//	credit   = exp(-(backlog - min backlog)/credit_decay) * overlap * block_size
//	new      = max(0, prompt_tokens - credit)
//	cost     = (queued_prefill + new)/prefill_rate
//	         + decode_weight*running_decode/decode_rate + waiting_penalty*waiting
//	         + evict (cache pressure: blocks written beyond the replica's free
//	           room, Candidate.Capacity - Held, at block_size/prefill_rate each)
//
// and picks the cheapest, after the affinity, conversation (Request.SessionKey)
// and stripe rules of its type doc; ties go to the lower load, then at random. Other
// policies: random, round_robin, least_load, session (rendezvous hashing of
// Request.SessionKey), prefix_chars (vLLM production-stack's 128-character
// chunk trie) and the peers' algorithms dynamo, llmd and sglang, each cited
// in its doc comment. NewPolicy builds one by name.
//
// # Concurrency, time, randomness
//
// Router and every Policy are safe for concurrent use: Route takes a read
// lock on the replica set, the index takes its own locks, loads are atomics,
// and policies with state (round_robin's counter, prefix_chars' trie, the
// random tie-break source) guard it themselves. Nothing starts
// goroutines. Time comes from Config.Now and randomness from Config.Rand, so a
// simulator replays runs exactly.
package routing
