package main

import (
	"context"
	"log/slog"
	"net"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"kvrouter/internal/discovery"
	"kvrouter/internal/fleet"
	"kvrouter/internal/pool"
	"kvrouter/internal/proxy"
	"kvrouter/internal/vllm/kvevents"
)

// newDiscoveredGroup wires a model group whose engines come from
// Kubernetes: a discovery source whose snapshots a pool applies to the
// fleet, the group's backend and its tokenizer, each engine with its KV
// event subscriber and tokenizer source. The returned func runs all of it
// until ctx ends; a source refused by the API server (RBAC) ends it with
// that error.
func newDiscoveredGroup(m proxy.ModelConfig, flt *fleet.Fleet, b *proxy.Backend, ts *tokenSource,
	subMetrics *kvevents.SubscriberMetrics, log *slog.Logger, reg prometheus.Registerer) (func(context.Context) error, error) {
	src, err := discovery.New(*m.Discovery, nil, log.With("model", m.Name), reg)
	if err != nil {
		return nil, err
	}
	parts := func(e pool.Engine, ep *fleet.Endpoint) ([]pool.Part, error) {
		var out []pool.Part
		if e.Events != "" {
			sub, err := kvevents.NewSubscriber(kvevents.SubscriberConfig{
				Engine: e.Name, Endpoint: e.Events, ReplayEndpoint: e.Replay, DPSize: e.DPSize, Topic: e.Topic,
			}, log.With("model", m.Name), subMetrics)
			if err != nil {
				return nil, err
			}
			out = append(out, pool.Part{Name: "kv events", Run: func(ctx context.Context) error { return sub.Run(ctx, b.Apply) }})
		}
		if ts.failover != nil {
			et, probe, err := ts.engine(ep, log, reg)
			if err != nil {
				return nil, err
			}
			if err := ts.failover.Add(et); err != nil {
				return nil, err
			}
			pt := pool.Part{Name: "tokenizer", Close: func() { ts.failover.Remove(ep.Name()) }}
			if probe != nil {
				pt.Run = func(ctx context.Context) error { return ignoreCanceled(probe.Run(ctx)) }
				pt.Close = func() { ts.failover.Remove(ep.Name()); probe.Close() }
			}
			out = append(out, pt)
		}
		return out, nil
	}
	p, err := pool.New(pool.Deps{Model: m.Name, Fleet: flt, Replicas: b, Parts: parts}, log, reg)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		g, gctx := errgroup.WithContext(ctx)
		g.Go(recovered("discovery", func() error { return src.Run(gctx) }))
		g.Go(recovered("pool", func() error { return ignoreCanceled(p.Run(gctx)) }))
		g.Go(recovered("discovery snapshots", func() error {
			warned := false
			for {
				select {
				case <-gctx.Done():
					return nil
				case snap := <-src.Snapshots():
					engines := poolEngines(snap)
					if !warned && hasAPIKeySecret(snap) {
						warned = true
						log.Warn("engine API-key Secret references are not read yet; those engines get no API key", "annotation", discovery.AnnotationAPIKeySecret)
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
// the engine's address, KV events and replay on its host at the annotated
// (or default) ports, routable only when ready. An engine is named by its
// Pod, or by its address when two share a Pod name.
func poolEngines(s discovery.Snapshot) []pool.Engine {
	count := map[string]int{}
	for _, e := range s.Engines {
		count[e.Name]++
	}
	out := make([]pool.Engine, 0, len(s.Engines))
	for _, e := range s.Engines {
		name := e.Name
		if count[name] > 1 {
			name = e.Addr
		}
		pe := pool.Engine{Name: name, URL: "http://" + e.Addr, DPSize: max(e.Settings.DPSize, 1), Topic: e.Settings.Topic,
			Routable: e.State == discovery.StateReady}
		if e.Settings.EventsPort > 0 {
			pe.Events = "tcp://" + net.JoinHostPort(e.Host(), strconv.Itoa(e.Settings.EventsPort))
		}
		if e.Settings.ReplayPort > 0 {
			pe.Replay = "tcp://" + net.JoinHostPort(e.Host(), strconv.Itoa(e.Settings.ReplayPort))
		}
		out = append(out, pe)
	}
	return out
}

func hasAPIKeySecret(s discovery.Snapshot) bool {
	for _, e := range s.Engines {
		if e.Settings.APIKeySecret.Name != "" {
			return true
		}
	}
	return false
}
