package pool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/fleet"
)

// Engine is one engine of a group as its source describes it.
type Engine struct {
	// Name is unique within the group: the fleet endpoint's and routing
	// replica's name.
	Name string
	// URL is the engine's HTTP base URL, "http://10.1.2.3:8000".
	URL string
	// APIKey is sent to the engine as a bearer token ("" none).
	APIKey string
	// Events and Replay are the KV event and replay endpoints of rank 0,
	// "tcp://10.1.2.3:5557" ("" none); EventsBind, Topic, DPSize, IdleCheck
	// and QueueSize as in kvevents.SubscriberConfig.
	Events, Replay string
	EventsBind     bool
	Topic          string
	DPSize         int
	IdleCheck      time.Duration
	QueueSize      int
	// Routable: the engine may get new requests. False for an engine that
	// is listed but not ready, or terminating and still serving: it keeps
	// its endpoint, index entries and parts and finishes what it has.
	Routable bool
}

// sameEngine reports whether a and b are the same engine process as far
// as the router's connections go (Routable and APIKey aside: both change
// in place).
func sameEngine(a, b Engine) bool {
	a.Routable, b.Routable = false, false
	a.APIKey, b.APIKey = "", ""
	return a == b
}

// Part is something an engine needs beside its endpoint and replica, built
// by Deps.Parts when the engine is added.
type Part struct {
	// Name labels the part in logs, e.g. "kv events".
	Name string
	// Run runs the part until ctx ends (nil: nothing to run). An error
	// other than ctx's is logged; the engine stays without the part.
	Run func(ctx context.Context) error
	// Close releases the part after Run has returned (nil: nothing).
	Close func()
}

// Endpoints is what the pool needs of the fleet (*fleet.Fleet).
type Endpoints interface {
	Add(ec fleet.EndpointConfig) (*fleet.Endpoint, error)
	Remove(name string) bool
	SetRoutable(name string, ok bool)
}

// Replicas is what the pool needs of a group's routing (*group.Backend).
type Replicas interface {
	AddReplica(name string, dpSize int)
	RemoveReplica(name string)
}

// Deps are the pool's collaborators.
type Deps struct {
	// Model is the group's model name (the endpoints serve it).
	Model string
	// Fleet and Replicas are required.
	Fleet    Endpoints
	Replicas Replicas
	// Parts builds an engine's parts once its endpoint exists (nil: none).
	Parts func(e Engine, ep *fleet.Endpoint) ([]Part, error)
}

// engine is a member of the pool.
type engine struct {
	Engine
	ep      *fleet.Endpoint
	parts   []Part
	started bool
	cancel  context.CancelFunc
	done    chan struct{} // closed when every part's Run has returned
}

// Pool keeps one group's engines; see the package doc.
type Pool struct {
	deps Deps
	log  *slog.Logger
	m    *metrics

	mu      sync.Mutex
	engines map[string]*engine
	running bool
	start   func(e *engine) // starts e's parts; set while Run runs
}

// New returns an empty pool; it starts nothing (see Run). A nil log
// discards; reg may be nil.
func New(deps Deps, log *slog.Logger, reg prometheus.Registerer) (*Pool, error) {
	if deps.Fleet == nil || deps.Replicas == nil {
		return nil, errors.New("pool: Fleet and Replicas are required")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(reg, deps.Model)
	if err != nil {
		return nil, err
	}
	return &Pool{deps: deps, log: log.With("model", deps.Model), m: m, engines: map[string]*engine{}}, nil
}

// names returns the engines' names, sorted.
func (p *Pool) names() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, 0, len(p.engines))
	for n := range p.engines {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// EngineError is why Set could not add one engine.
type EngineError struct {
	// Engine is the engine's name.
	Engine string
	Err    error
}

func (e *EngineError) Error() string { return "engine " + e.Engine + ": " + e.Err.Error() }

// Unwrap returns the cause.
func (e *EngineError) Unwrap() error { return e.Err }

// Set makes the pool's engines those of want: adds the new (in want's
// order, which is the fleet's order), removes the gone (waiting for their
// parts to stop), re-adds the changed, updates who is routable and swaps
// a changed API key in place (index entries and parts kept). Engines
// it could not add (a bad URL, a part that could not be built) are left out
// and returned as *EngineError (joined); the rest of want is applied.
// Duplicate names in want are an error and change nothing.
func (p *Pool) Set(want []Engine) error {
	byName := make(map[string]Engine, len(want))
	for _, e := range want {
		if _, dup := byName[e.Name]; dup || e.Name == "" {
			return fmt.Errorf("pool %s: engine name %q empty or listed twice", p.deps.Model, e.Name)
		}
		byName[e.Name] = e
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for name, cur := range p.engines {
		if w, ok := byName[name]; !ok || !sameEngine(w, cur.Engine) {
			p.removeLocked(cur)
		}
	}
	var errs []error
	for _, w := range want {
		name := w.Name
		cur, ok := p.engines[name]
		if !ok {
			if err := p.addLocked(w); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if cur.APIKey != w.APIKey {
			cur.APIKey = w.APIKey
			if cur.ep != nil {
				cur.ep.SetAPIKey(w.APIKey)
			}
			p.log.Info("engine API key changed", "engine", name)
		}
		if cur.Routable != w.Routable {
			cur.Routable = w.Routable
			p.deps.Fleet.SetRoutable(name, w.Routable)
			p.log.Info("engine routable changed", "engine", name, "routable", w.Routable)
		}
	}
	p.m.engines.Set(float64(len(p.engines)))
	return errors.Join(errs...)
}

func (p *Pool) addLocked(w Engine) error {
	ep, err := p.deps.Fleet.Add(fleet.EndpointConfig{Name: w.Name, URL: w.URL, Models: []string{p.deps.Model}, APIKey: w.APIKey})
	if err != nil {
		return &EngineError{Engine: w.Name, Err: err}
	}
	var parts []Part
	if p.deps.Parts != nil {
		if parts, err = p.deps.Parts(w, ep); err != nil {
			p.deps.Fleet.Remove(w.Name)
			return &EngineError{Engine: w.Name, Err: err}
		}
	}
	p.deps.Replicas.AddReplica(w.Name, max(w.DPSize, 1))
	p.deps.Fleet.SetRoutable(w.Name, w.Routable)
	e := &engine{Engine: w, ep: ep, parts: parts, done: make(chan struct{})}
	p.engines[w.Name] = e
	p.m.changes.WithLabelValues("added").Inc()
	p.log.Info("engine added", "engine", w.Name, "url", w.URL, "events", w.Events, "routable", w.Routable)
	if p.start != nil {
		p.start(e)
	}
	return nil
}

// removeLocked stops e's parts and waits for them, then releases its
// replica (index entries included) and endpoint.
func (p *Pool) removeLocked(e *engine) {
	p.deps.Fleet.SetRoutable(e.Name, false)
	e.stopLocked()
	p.deps.Replicas.RemoveReplica(e.Name)
	p.deps.Fleet.Remove(e.Name)
	delete(p.engines, e.Name)
	p.m.changes.WithLabelValues("removed").Inc()
	p.log.Info("engine removed", "engine", e.Name, "url", e.URL)
}

// stopLocked stops e's parts, waits for them and closes them (once).
func (e *engine) stopLocked() {
	if e.started {
		e.cancel()
		<-e.done
	}
	for _, pt := range e.parts {
		if pt.Close != nil {
			pt.Close()
		}
	}
	e.parts = nil
}

// Close releases the parts of every engine (after Run has returned, or
// when it will not be called); the engines stay listed.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range p.engines {
		e.stopLocked()
	}
}

// Run runs every engine's parts, those of engines added later too, until
// ctx ends; then it stops them, waits for them, closes them and returns
// ctx's error.
func (p *Pool) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	p.mu.Lock()
	if p.running {
		p.mu.Unlock()
		return fmt.Errorf("pool %s: Run called twice", p.deps.Model)
	}
	p.running = true
	p.start = func(e *engine) {
		ectx, cancel := context.WithCancel(ctx)
		e.started, e.cancel = true, cancel
		var ewg sync.WaitGroup
		for _, pt := range e.parts {
			if pt.Run == nil {
				continue
			}
			ewg.Go(func() { p.runPart(ectx, e.Name, pt) })
		}
		wg.Go(func() { ewg.Wait(); close(e.done) })
	}
	for _, name := range sortedKeys(p.engines) {
		p.start(p.engines[name])
	}
	p.mu.Unlock()

	<-ctx.Done()
	p.mu.Lock()
	p.start = nil
	p.mu.Unlock()
	wg.Wait()
	p.Close()
	return ctx.Err()
}

// runPart runs one part, turning a panic into an error, and logs how it
// ended unless ctx ended it.
func (p *Pool) runPart(ctx context.Context, engine string, pt Part) {
	err := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("panic: %v", r)
			}
		}()
		return pt.Run(ctx)
	}()
	if ctx.Err() != nil {
		return
	}
	p.m.partFailures.WithLabelValues(pt.Name).Inc()
	p.log.Error("engine part stopped", "engine", engine, "part", pt.Name, "err", err)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
