package main

import (
	"context"
	"log/slog"

	"kvrouter/internal/discovery"
	"kvrouter/internal/proxy"
)

// newPeers runs router.yaml's peers block: a discovery.Peers over the
// router Pods whose every new place (routers, router_index) goes to every
// model group's router (proxy.Backend.SetStripes). The returned func runs
// until ctx ends and never fails on the API server's account: until the
// place is known each router routes as one.
func newPeers(cfg *discovery.PeersConfig, backends map[string]*proxy.Backend, log *slog.Logger) (func(context.Context) error, error) {
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
