package sim

import (
	"fmt"
	"math/rand/v2"

	"kvrouter/internal/kvindex"
	"kvrouter/internal/routing"
	"kvrouter/internal/vllm"
)

// Front balancers of Config.Front: how requests are spread over the router
// replicas (Config.Routers).
const (
	FrontRoundRobin = "round_robin"
	FrontRandom     = "random"
)

// peer is a router replica beyond the fleet's first: its own Router (own
// leases, so its own view of the load it routed) and, for a policy that
// keeps one, its own index (own predictions), fed the same KV event batches
// as the first's, as every kvrouter replica subscribes to every engine.
type peer struct {
	router *routing.Router
	ix     *kvindex.Exact
}

// addPeers builds the Config.Routers-1 router replicas after the first
// (f.router, f.ix), each seeded apart.
func (f *fleet) addPeers(seed uint64) error {
	f.frontRng = rand.New(rand.NewPCG(seed, 0xf407))
	for k := 1; k < f.cfg.Routers; k++ {
		var p peer
		if f.ix != nil {
			ix, err := kvindex.NewExact(f.ixCfg, nil, nil)
			if err != nil {
				return err
			}
			p.ix = ix
		}
		rcfg := f.rCfg
		rcfg.Rand = rand.New(rand.NewPCG(seed+uint64(k), 0x4047))
		if rcfg.Routers > 1 {
			rcfg.RouterIndex = k % rcfg.Routers
		}
		var ix routing.Index
		if p.ix != nil {
			ix = p.ix
		}
		r, err := routing.New(rcfg, ix, nil, nil)
		if err != nil {
			return fmt.Errorf("router replica %d: %w", k, err)
		}
		p.router = r
		f.peers = append(f.peers, p)
	}
	return nil
}

// pickRouter is the front balancer: the router replica that routes the
// next request.
func (f *fleet) pickRouter() *routing.Router {
	n := len(f.peers) + 1
	k := 0
	switch {
	case n == 1:
	case f.cfg.Front == FrontRandom:
		k = f.frontRng.IntN(n)
	default:
		k = f.frontNext % n
		f.frontNext++
	}
	if k == 0 {
		return f.router
	}
	return f.peers[k-1].router
}

// eachRouter calls fn on every router replica.
func (f *fleet) eachRouter(fn func(*routing.Router)) {
	if f.router == nil {
		return
	}
	fn(f.router)
	for _, p := range f.peers {
		fn(p.router)
	}
}

// applyPeers applies a batch to the peers' indexes (never pipelined: a
// fleet with peers applies on its own goroutine).
func (f *fleet) applyPeers(name string, b *vllm.Batch) {
	for _, p := range f.peers {
		if p.ix != nil {
			p.ix.Apply(name, b)
		}
	}
}
