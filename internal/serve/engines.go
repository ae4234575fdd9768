package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/config"
	"kvrouter/internal/fleet"
	"kvrouter/internal/group"
	"kvrouter/internal/pool"
	"kvrouter/internal/tokenizer"
	"kvrouter/internal/vllm/kvevents"
)

// engineParts builds what each engine of one model group needs beside its
// endpoint and replica, for the group's pool: the KV event subscriber
// feeding the group's backend, and the engine's token source in the
// group's failover tokenizer with its mismatch probe. Engines from
// router.yaml and from discovery get theirs the same way.
type engineParts struct {
	model   string
	backend *group.Backend
	tokens  *tokenSource
	subMet  *kvevents.SubscriberMetrics
	maxMsg  int64 // events_max_message_bytes (0: kvevents' default)
	log     *slog.Logger
	reg     prometheus.Registerer

	mu     sync.Mutex
	probes map[string]*tokenizer.Probe     // by engine, while it is in the pool
	subs   map[string]*kvevents.Subscriber // by engine, while it is in the pool
}

// build implements pool.Deps.Parts.
func (g *engineParts) build(e pool.Engine, ep *fleet.Endpoint) ([]pool.Part, error) {
	var out []pool.Part
	if e.Events != "" {
		sub, err := kvevents.NewSubscriber(kvevents.SubscriberConfig{
			Engine: e.Name, Endpoint: e.Events, ReplayEndpoint: e.Replay, DPSize: e.DPSize,
			Bind: e.EventsBind, Topic: e.Topic, IdleCheck: e.IdleCheck, QueueSize: e.QueueSize,
			MaxMessageBytes: g.maxMsg, Resume: g.backend.Resume(e.Name),
		}, g.log, g.subMet)
		if err != nil {
			return nil, &partError{field: "events", err: err}
		}
		g.mu.Lock()
		g.subs[e.Name] = sub
		g.mu.Unlock()
		out = append(out, pool.Part{Name: "kv events", Run: func(ctx context.Context) error { return sub.Run(ctx, g.backend.Apply) },
			Close: func() {
				g.mu.Lock()
				if g.subs[e.Name] == sub {
					delete(g.subs, e.Name)
				}
				g.mu.Unlock()
			}})
	}
	if g.tokens.failover == nil {
		return out, nil
	}
	et, probe, err := g.tokens.engine(ep, g.log, g.reg)
	if err == nil {
		err = g.tokens.failover.Add(et)
	}
	if err != nil {
		return nil, &partError{field: "tokenizer", err: err}
	}
	pt := pool.Part{Name: "tokenizer", Close: func() { g.tokens.failover.Remove(ep.Name()) }}
	if probe != nil {
		g.mu.Lock()
		g.probes[e.Name] = probe
		g.mu.Unlock()
		pt.Run = func(ctx context.Context) error { return ignoreCanceled(probe.Run(ctx)) }
		pt.Close = func() {
			g.tokens.failover.Remove(ep.Name())
			probe.Close()
			g.mu.Lock()
			delete(g.probes, e.Name)
			g.mu.Unlock()
		}
	}
	return append(out, pt), nil
}

// eventsConnected adds to conn, for each engine of the group with a KV
// event subscriber, whether its streams are all connected
// (kvevents.Subscriber.Connected); an engine already false stays false.
func (g *engineParts) eventsConnected(conn map[string]bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for name, sub := range g.subs {
		up, seen := conn[name]
		conn[name] = sub.Connected() && (up || !seen)
	}
}

// connectedEngines returns the engines of groups with a KV event
// subscriber, true for those whose streams are all connected, false for
// the others (proxy.Deps.EventsConnected).
func connectedEngines(groups []*engineParts) map[string]bool {
	conn := map[string]bool{}
	for _, g := range groups {
		g.eventsConnected(conn)
	}
	return conn
}

// currentProbes returns the mismatch probes of the engines in the pool.
func (g *engineParts) currentProbes() []*tokenizer.Probe {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]*tokenizer.Probe, 0, len(g.probes))
	for _, p := range g.probes {
		out = append(out, p)
	}
	return out
}

// partError names the engine setting a part could not be built from.
type partError struct {
	field string // "events" or "tokenizer"
	err   error
}

func (e *partError) Error() string { return e.err.Error() }
func (e *partError) Unwrap() error { return e.err }

// staticEngines are a model group's engines as router.yaml lists them, in
// its order, named as the fleet names them (name, else the URL's host).
func staticEngines(m config.Model) []pool.Engine {
	out := make([]pool.Engine, 0, len(m.Engines))
	for _, e := range m.Engines {
		out = append(out, pool.Engine{Name: engineName(e), URL: e.URL, APIKey: e.APIKey,
			Events: e.Events, Replay: e.Replay, EventsBind: e.EventsBind, Topic: e.Topic,
			DPSize: e.DPSize, IdleCheck: e.IdleCheck, QueueSize: e.EventsQueue, Routable: true})
	}
	return out
}

// engineName is e's name, or its URL's host:port when unnamed.
func engineName(e config.Engine) string {
	if e.Name != "" {
		return e.Name
	}
	if u, err := url.Parse(e.URL); err == nil && u.Host != "" {
		return u.Host
	}
	return e.URL
}

// engineErrors maps the errors of a pool's Set on router.yaml's engines to
// their fields ("models[i].engines[j].events (line n): ...").
func engineErrors(err error, m config.Model, i int, pos config.Positions) error {
	var list []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		list = j.Unwrap()
	} else {
		list = []error{err}
	}
	out := make([]error, 0, len(list))
	for _, e := range list {
		var ee *pool.EngineError
		if !errors.As(e, &ee) {
			out = append(out, e)
			continue
		}
		field := []any{"models", i, "engines"}
		for j, ec := range m.Engines {
			if engineName(ec) == ee.Engine {
				field = append(field, j)
			}
		}
		var pe *partError
		if errors.As(ee.Err, &pe) {
			field = append(field, pe.field)
		}
		out = append(out, fmt.Errorf("%s: %w", pos.Field(field...), ee.Err))
	}
	return errors.Join(out...)
}
