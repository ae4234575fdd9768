package serve

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"kvrouter/internal/config"
	"kvrouter/internal/discovery"
	"kvrouter/internal/pool"
	"kvrouter/internal/proxy"
)

// newDiscoveredGroup runs the discovery source of a model group whose
// engines come from Kubernetes and applies each snapshot to the group's
// pool p (which gives every engine its parts, as for router.yaml's). The
// returned func runs until ctx ends; a source refused by the API server
// (RBAC) ends it with that error. The engines' roles (from the Pods' role
// label) go to the server in srv before the pool changes, so that a Pod
// added as a prefill engine is never routed whole requests.
func newDiscoveredGroup(m config.Model, p *pool.Pool, srv *atomic.Pointer[proxy.Server], log *slog.Logger, reg prometheus.Registerer) (func(context.Context) error, error) {
	log = log.With("model", m.Name)
	src, err := discovery.New(*m.Discovery, nil, log, reg)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		g, gctx := errgroup.WithContext(ctx)
		g.Go(recovered("discovery", func() error { return src.Run(gctx) }))
		g.Go(recovered("discovery snapshots", func() error {
			for {
				select {
				case <-gctx.Done():
					return nil
				case snap := <-src.Snapshots():
					engines, roles := poolEngines(snap)
					if s := srv.Load(); s != nil {
						s.SetRoles(m.Name, roles)
					}
					if err := p.Set(engines); err != nil {
						log.Warn("some discovered engines could not be added", "err", err)
					}
				}
			}
		}))
		return g.Wait()
	}, nil
}

// poolEngines turns a discovery snapshot into the pool's engines: HTTP on
// the engine's address with its API key (from its Secret), KV events and replay on its host at the annotated
// (or default) ports, routable only when ready. An engine is named by its
// Pod, or by its address when two share a Pod name. roles maps those names
// to the engines' P/D roles (discovery.Engine.Role; none when off).
func poolEngines(s discovery.Snapshot) (engines []pool.Engine, roles map[string]string) {
	count := map[string]int{}
	for _, e := range s.Engines {
		count[e.Name]++
	}
	out := make([]pool.Engine, 0, len(s.Engines))
	roles = map[string]string{}
	for _, e := range s.Engines {
		name := e.Name
		if count[name] > 1 {
			name = e.Addr
		}
		if e.Role != "" {
			roles[name] = e.Role
		}
		pe := pool.Engine{Name: name, URL: "http://" + e.Addr, APIKey: e.APIKey, DPSize: max(e.Settings.DPSize, 1), Topic: e.Settings.Topic,
			Routable: e.State == discovery.StateReady}
		if e.Settings.EventsPort > 0 {
			pe.Events = "tcp://" + net.JoinHostPort(e.Host(), strconv.Itoa(e.Settings.EventsPort))
		}
		if e.Settings.ReplayPort > 0 {
			pe.Replay = "tcp://" + net.JoinHostPort(e.Host(), strconv.Itoa(e.Settings.ReplayPort))
		}
		out = append(out, pe)
	}
	return out, roles
}
