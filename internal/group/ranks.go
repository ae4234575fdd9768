package group

import "kvrouter/internal/routing"

// Data-parallel ranks as routing candidates.
//
// An engine started with --data-parallel-size N (and vLLM's internal load
// balancer) serves N engine cores behind one HTTP endpoint; each rank has its
// own KV cache and publishes its own KV events (port+rank). Left to itself,
// vLLM picks the rank by queue length alone (vllm/v1/engine/core_client.py,
// DPLBAsyncMPClient.get_core_engine_for_request: waiting*4 + running), so a
// prefix cached on rank 1 is recomputed on rank 0. A request carrying the
// header X-data-parallel-rank goes to that rank instead (vLLM:
// vllm/entrypoints/openai/engine/serving.py _get_data_parallel_rank; HTTP
// header names are case-insensitive).
//
// So a Backend routes over ranks: an engine with dp_size > 1 is one routing
// replica per rank, named RankReplica(engine, rank), each with its own index
// entries (from its own event stream), load lease and gauges (the engine's
// /metrics per engine label). The chosen rank goes to the engine in a
// request header (Decision.DPRank; the HTTP front sets it).

// replicaNames returns the routing replicas of engine: one per rank when
// its dp_size is above 1, else the engine's own name. Call with b.repMu
// not held.
func (b *Backend) replicaNames(engine string) []string {
	dp := b.DPSize(engine)
	if dp <= 1 {
		return []string{engine}
	}
	out := make([]string, dp)
	for r := range dp {
		out[r] = RankReplica(engine, r)
	}
	return out
}

// splitReplica maps a routing replica name back to its engine and rank
// (rank -1: the engine is routed whole).
func (b *Backend) splitReplica(name string) (engine string, rank int) {
	engine, r, ok := SplitRankReplica(name)
	if !ok || b.DPSize(engine) <= 1 || !b.has(engine) {
		return name, -1
	}
	return engine, r
}

// eventReplica is the routing replica whose index entries a KV event
// update of engine's rank feeds.
func (b *Backend) eventReplica(engine string, rank int) string {
	if b.DPSize(engine) <= 1 {
		return engine
	}
	return RankReplica(engine, rank)
}

// observeRanks passes one scrape's gauges to the router: per rank from the
// series labelled with the rank's engine value when the engine has several
// ranks (the engine's totals split evenly when a rank's series are absent).
func (b *Backend) observeRanks(g *generation, engine string, m EngineMetrics, gauges routing.Gauges) {
	dp := b.DPSize(engine)
	if dp <= 1 {
		g.router.ObserveGauges(engine, gauges)
		return
	}
	for r := range dp {
		rg := gauges
		if running, waiting, kvUsage, ok := m.RankLoad(r); ok {
			rg.Waiting, rg.Running, rg.KVUsage = int(waiting), int(running), kvUsage
		} else {
			rg.Waiting, rg.Running = gauges.Waiting/dp, gauges.Running/dp
		}
		g.router.ObserveGauges(RankReplica(engine, r), rg)
	}
}

// observeRates feeds engine's rate counters to its routing replicas: with
// data-parallel ranks, each rank gets an equal share of the tokens and
// seconds (the counters are summed over ranks), so each learns the
// per-rank rate of a fleet of equal ranks.
func (b *Backend) observeRates(g *generation, engine string, s routing.RateSample) {
	dp := b.DPSize(engine)
	if dp <= 1 {
		g.router.ObserveRates(engine, s)
		return
	}
	f := float64(dp)
	s.PrefillTokens, s.PrefillSeconds, s.DecodeTokens, s.DecodeSeconds = s.PrefillTokens/f, s.PrefillSeconds/f, s.DecodeTokens/f, s.DecodeSeconds/f
	for r := range dp {
		g.router.ObserveRates(RankReplica(engine, r), s)
	}
}

// setCapacity gives engine's routing replicas their share of its blocks
// (each data-parallel rank its own cache), in g's approximate index if it
// has one and in its router (kv's cache pressure).
func (b *Backend) setCapacity(g *generation, engine string, blocks int) {
	names := b.replicaNames(engine)
	for _, n := range names {
		if g.approx != nil {
			g.approx.SetCapacity(n, max(blocks/len(names), 1))
		}
		g.router.SetCapacity(n, max(blocks/len(names), 1))
	}
}

// setRank turns a rank replica's name in d into its engine's name and the
// rank to send.
func (b *Backend) setRank(d *Decision) {
	if e, r := b.splitReplica(d.Replica); r >= 0 {
		d.Replica, d.DPRank, d.HasDPRank = e, r, true
	}
	if d.Shadow != nil {
		d.Shadow.Replica, _ = b.splitReplica(d.Shadow.Replica)
	}
}
