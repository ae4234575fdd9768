package sim

import (
	"fmt"
	"time"

	"kvrouter/internal/enginesim"
	"kvrouter/internal/group"
	"kvrouter/internal/routing"
)

// A data-parallel fleet (Config.DPSize > 1): each engine runs DPSize ranks
// behind one endpoint, as vllm serve --data-parallel-size does, each rank
// its own Core (cache, scheduler, queue) and its own KV events (batches
// carry the rank). The router either
//
//   - sees every rank as a replica ("r00#dp1"), routes to one and sends the
//     rank header: what kvrouter does with an engine's dp_size set; or
//   - with Config.DPRankBlind sees each engine as one replica ("r00"): its
//     index holds the blocks of every rank under the engine's name (a hit
//     on any rank counts), its gauges are the ranks' sums, and vLLM's own
//     balancer picks the rank.
//
// vLLM's balancer (vllm/v1/engine/core_client.py DPLBAsyncMPClient
// get_core_engine_for_request, one API server): the rank of the lowest
// waiting*4 + running, the first such from rank 0, read from counts the DP
// coordinator publishes (its comment: "every 100ms"); between two updates
// the client adds 1 to the chosen rank's waiting count, so a burst spreads.
// Modelled: counts refreshed from the ranks' cores when the last refresh is
// 100 ms old or more (at a pick), plus the local increment.

// dpStatsInterval is how often the DP coordinator publishes rank counts.
const dpStatsInterval = 100 * time.Millisecond

// dpBalancer is one engine's view of its ranks' load, as vLLM's API server
// holds it.
type dpBalancer struct {
	at     time.Duration // virtual time of the last refresh; -1: never
	counts [][2]int      // per rank: waiting, running
}

// pick returns the rank replica (an index into f.reps) for a request to the
// engine whose rank 0 is reps[first].
func (b *dpBalancer) pick(f *fleet, first int) int {
	if b.at < 0 || f.now-b.at >= dpStatsInterval {
		b.at = f.now
		for r := range b.counts {
			c := f.reps[first+r].core
			b.counts[r] = [2]int{c.Waiting(), c.Running()}
		}
	}
	best, bestScore := 0, -1
	for r, c := range b.counts {
		if s := c[0]*4 + c[1]; bestScore < 0 || s < bestScore {
			best, bestScore = r, s
		}
	}
	b.counts[best][0]++
	return first + best
}

// addDPEngines adds n engines of f.cfg.DPSize ranks each.
func (f *fleet) addDPEngines(n int) error {
	dp := f.cfg.DPSize
	for range n {
		engine := fmt.Sprintf("r%02d", len(f.reps)/dp)
		first := len(f.reps)
		for rank := range dp {
			ecfg := f.cfg.Engine
			ecfg.NoEvents = f.ix == nil
			core, err := enginesim.NewCore(ecfg)
			if err != nil {
				return err
			}
			r := &replica{name: group.RankReplica(engine, rank), core: core, rank: rank, route: engine}
			if !f.cfg.DPRankBlind {
				r.route = r.name
			}
			f.reps = append(f.reps, r)
			f.run.Replicas = append(f.run.Replicas, r.name)
			if rank > 0 && f.cfg.DPRankBlind {
				continue
			}
			f.byName[r.route] = len(f.reps) - 1
			gpu, _ := f.gpuBlocks()
			if f.cfg.DPRankBlind {
				gpu *= dp // the engine's ranks behind one endpoint
			}
			f.eachRouter(func(rt *routing.Router) {
				rt.AddReplica(r.route)
				rt.SetCapacity(r.route, gpu)
				switch f.cfg.Rates {
				case RatesKnown:
					rate := f.cfg.prefillRate()
					if f.cfg.DPRankBlind {
						rate *= float64(dp) // the engine prefills on every rank
					}
					rt.SetRates(r.route, rate, 0)
				}
			})
		}
		if f.cfg.DPRankBlind {
			if f.lb == nil {
				f.lb = map[int]*dpBalancer{}
			}
			f.lb[first] = &dpBalancer{at: -1, counts: make([][2]int, dp)}
		}
	}
	return nil
}

// dpGauges passes each engine's gauges to the router, summed over its
// ranks (DPRankBlind): the engine's /metrics totals.
func (f *fleet) dpGauges(at time.Time) {
	for first := 0; first < len(f.reps); first += f.cfg.DPSize {
		var g routing.Gauges
		g.At = at
		for r := range f.cfg.DPSize {
			c := f.reps[first+r].core
			g.Waiting += c.Waiting()
			g.Running += c.Running()
			g.KVUsage += c.KVUsage() / float64(f.cfg.DPSize)
		}
		name := f.reps[first].route
		f.eachRouter(func(rt *routing.Router) { rt.ObserveGauges(name, g) })
	}
}
