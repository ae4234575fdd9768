// Package sim simulates a fleet of vLLM replicas on a virtual clock to
// compare routing policies on identical traffic, in seconds of CPU for
// hours of traffic.
//
// Each replica is an enginesim.Core (the same scheduler, prefix cache and
// timing model as "kvrouter engine-sim"), driven step by step: a step
// starts when the replica has work, lasts the Core's modelled duration, and
// its output tokens and KV events take effect when it ends. Routing uses the
// real routing.Router over a real kvindex.Exact fed by those KV events,
// delivered after Config.EventDelay and dropped with probability
// Config.EventLoss (per batch, as a ZeroMQ high-water mark drops). The
// router's engine gauges (waiting, running, KV usage) are refreshed every
// Config.GaugeInterval, as kvrouter's scraper does. Replicas can be added or
// removed mid-run (Config.Scale); a removed replica stops receiving requests
// at once and finishes those it holds.
//
// Every policy replays the same workload (same arrivals, same tokens) from a
// cold fleet, each in its own goroutine (Config.Parallel at a time), with
// its own seeded randomness: a run is reproducible from Config.Seed. Per
// Config.Pipeline, a policy's fleet may apply its KV events to its index on
// a second goroutine (pipeline.go): the main loop waits for it before every
// routing decision and fleet change, so the run is identical either way. Besides
// routing's policies, "cache_greedy" (formerly "oracle", a name still
// accepted) routes with global knowledge of every cache (each engine's
// prefix cache read at the decision, Core.CachedPrefix: what an index fed
// instantly and losslessly at scheduling would hold; it needs no KV events)
// to the replica holding the longest prefix among those with the fewest
// waiting: a queue-avoiding greedy, not an upper bound. Two references bound
// the hit rate: HitRateBound (every earlier block cached everywhere,
// forever: no policy can exceed it) and PooledBound (the fleet's blocks
// pooled into one engine's LRU, requests served one at a time: what the
// fleet's cache could hold without placement constraints). Config.Routers > 1
// runs that many router replicas (routers.go), each with its own leases,
// index and predictions, all fed the same events and gauges, behind a front
// balancer (Config.Front).
//
// Time in the simulation never reads the wall clock: the index and router
// get Config.Now functions over the virtual clock. Run returns after all
// its goroutines have.
package sim
