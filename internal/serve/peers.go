package serve

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/config"
	"kvrouter/internal/discovery"
	"kvrouter/internal/group"
)

// newPeers runs router.yaml's peers block: a discovery.Peers over the
// router Pods whose every new place (routers, router_index) goes to every
// model group's router (group.Backend.SetStripes). The returned func runs
// until ctx ends and never fails on the API server's account: until the
// place is known each router routes as one. Each group's router's place is
// exported as kvrouter_discovery_peers_routers and
// kvrouter_discovery_peers_index (labelled model) on reg.
func newPeers(cfg *config.Peers, backends map[string]*group.Backend, log *slog.Logger, reg prometheus.Registerer) (func(context.Context) error, error) {
	for model, b := range backends {
		for _, g := range []struct {
			name, help string
			index      bool
		}{
			{"kvrouter_discovery_peers_routers", "Router replicas this replica counts itself among (router.yaml peers: the Ready router Pods; 1 while its own Pod is not among them), as its router uses them for stripes.", false},
			{"kvrouter_discovery_peers_index", "This replica's index among the router replicas (its Pod's place in name order), as its router uses it for stripes.", true},
		} {
			f := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: g.name, Help: g.help, ConstLabels: prometheus.Labels{"model": model}}, func() float64 {
				n, i := b.Stripes()
				if g.index {
					return float64(i)
				}
				return float64(max(n, 1))
			})
			if err := reg.Register(f); err != nil {
				return nil, fmt.Errorf("peers: %w", err)
			}
		}
	}
	p, err := discovery.NewPeers(*cfg, nil, func(n, i int) {
		for model, b := range backends {
			if err := b.SetStripes(n, i); err != nil { // not expected: Peers gives 0 <= i < n
				log.Error("router replicas: place refused", "model", model, "err", err)
			}
		}
	}, log)
	if err != nil {
		return nil, err
	}
	return p.Run, nil
}
