package serve

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"

	"kvrouter/internal/admission"
	"kvrouter/internal/config"
	"kvrouter/internal/fleet"
	"kvrouter/internal/group"
	"kvrouter/internal/kvindex"
	"kvrouter/internal/kvindex/kvindexprom"
	"kvrouter/internal/pool"
	"kvrouter/internal/proxy"
	"kvrouter/internal/routing/routingprom"
	"kvrouter/internal/tokenizer"
	"kvrouter/internal/tracing"
	"kvrouter/internal/ui"
	"kvrouter/internal/vllm/enginemetrics"
	"kvrouter/internal/vllm/kvevents"
)

// DefaultConfigPoll is how often serve reads router.yaml for a change of
// content (Options.Poll, the --config-poll flag's default).
const DefaultConfigPoll = 3 * time.Second

// Options are what New builds an App from.
type Options struct {
	// Config is the configuration to serve (defaults filled, validated);
	// Positions its fields' lines in the file, for error messages.
	Config    config.Config
	Positions config.Positions
	// ConfigPath is the router.yaml the configuration was read from (""
	// when built otherwise: no reloads); ConfigHash the SHA-256 of the
	// content read.
	ConfigPath string
	ConfigHash [32]byte
	// Getenv is the environment for reloads of ConfigPath (api_key_env,
	// KVROUTER_API_KEY); Override the command line's settings (--listen,
	// --tls-*), applied to each reloaded configuration (nil: none).
	Getenv   func(string) string
	Override func(*config.Config)
	// Poll is how often ConfigPath is read for a change (<= 0: never).
	Poll time.Duration
	// Reload receives a value (SIGHUP) for each asked reload (nil: none).
	Reload <-chan os.Signal
	// NoUI: no /ui page.
	NoUI bool
	// Version names the build in traces' resource.
	Version string
	// Log receives the application's logs (nil: discarded).
	Log *slog.Logger
}

// App is a built router, not yet serving: New wires it, Run serves it,
// Close releases it when Run will not be called.
type App struct {
	cfg config.Config
	pos config.Positions
	log *slog.Logger
	tls serveTLS
	// reg is the registry of every collector; flt the fleet; srv the HTTP
	// front (its Picker routes for the EPP).
	reg *prometheus.Registry
	flt *fleet.Fleet
	srv *proxy.Server
	// srvRef is srv once built, for the pools' and discovery's hooks.
	srvRef atomic.Pointer[proxy.Server]
	page   *ui.UI // set once the fleet exists, before anything runs; nil with NoUI
	// backends are the model groups' routers, written before anything
	// runs, then only read; exact the models on the event-fed index.
	backends map[string]*group.Backend
	exact    map[string]bool
	// groups are the model groups' engine parts (their subscribers, for
	// readiness); pools their pools, static those of the groups whose
	// engines router.yaml lists.
	groups []*engineParts
	pools  []*pool.Pool
	static map[string]*pool.Pool
	// runs are the long-lived loops Run starts beside the fleet and the
	// servers: pools, discovery, peers, the reloader.
	runs    []func(context.Context) error
	tracing *tracing.Tracing
	// admin is the admin listener once ListenAdmin opened it.
	admin net.Listener
}

// New wires the fleet, one routing backend per model, the event
// subscribers, the tokenizers (checked against the engines by their
// mismatch probes) and the HTTP server, starting none of them (see the
// package doc); every configuration error is returned here, before
// anything listens. o.Config must have its defaults filled and be valid
// (config.Parse, or FillDefaults and Validate).
func New(ctx context.Context, o Options) (*App, error) {
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &App{cfg: o.Config, pos: o.Positions, log: log, backends: map[string]*group.Backend{},
		exact: map[string]bool{}, static: map[string]*pool.Pool{}}
	var err error
	if a.tls, err = loadServeTLS(a.cfg.TLS); err != nil {
		return nil, err
	}
	a.reg = prometheus.NewRegistry()
	a.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if a.flt, err = fleet.New(a.fleetConfig(), log, a.reg); err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	if err := a.newGroups(); err != nil {
		a.closePools()
		return nil, err
	}
	if a.tracing, err = tracing.FromEnv(ctx, os.Getenv, o.Version); err != nil {
		a.closePools()
		return nil, err
	}
	if a.tracing.Enabled {
		log.Info("tracing on: OTLP export (OTEL_* environment)", "protocol", a.tracing.Protocol)
	}
	if err := a.newServer(o); err != nil {
		a.Close()
		return nil, err
	}
	if err := a.checkTokenizers(ctx); err != nil {
		a.Close()
		return nil, err
	}
	return a, nil
}

// fleetConfig is the fleet's configuration from router.yaml's health
// block and TLS settings, with the hooks that hand each engine's metrics
// and restarts to its groups' backends.
func (a *App) fleetConfig() fleet.Config {
	var fcfg fleet.Config
	for _, m := range a.cfg.Models {
		fcfg.Models = append(fcfg.Models, m.Name) // engines join through the groups' pools
	}
	h := a.cfg.Health
	fcfg.ProbeInterval, fcfg.ProbeTimeout, fcfg.ScrapeInterval = h.ProbeInterval, h.ProbeTimeout, h.ScrapeInterval
	fcfg.EjectAfterServerErrors, fcfg.EjectAfterBackpressure = h.EjectAfterServerErrors, h.EjectAfterBackpressure
	fcfg.BackoffBase, fcfg.BackoffMax = h.BackoffBase, h.BackoffMax
	fcfg.EjectAfterProbeTimeouts, fcfg.PanicThreshold, fcfg.ModelsInterval = h.EjectAfterProbeTimeouts, h.PanicThreshold, h.ModelsInterval
	fcfg.StallAfter = h.StallAfter
	fcfg.TLS = a.tls.engines
	fcfg.OnMetrics = func(ep *fleet.Endpoint, m enginemetrics.Metrics) {
		if a.page != nil {
			a.page.Observe(ep.Name(), m)
		}
		for _, model := range ep.Models() {
			if b := a.backends[model]; b != nil {
				b.Observe(ep.Name(), m, time.Now())
			}
		}
	}
	fcfg.OnRestart = func(ep *fleet.Endpoint) {
		// The path a kvevents reset takes: drop every rank's entries.
		for _, model := range ep.Models() {
			if b := a.backends[model]; b != nil {
				for r := range b.DPSize(ep.Name()) {
					b.Apply(kvevents.Update{Engine: ep.Name(), Rank: r, Reset: kvevents.ResetRestart, NoBatch: true})
				}
			}
		}
	}
	return fcfg
}

// newGroups builds each model group (newGroup) and the peers block,
// returning every problem at once.
func (a *App) newGroups() error {
	subMetrics, err := kvevents.NewSubscriberMetrics(a.reg)
	if err != nil {
		return err
	}
	snaps := readSnapshot(a.cfg.Snapshot.Path, a.log)
	var errs []error
	for i, m := range a.cfg.Models {
		if err := a.newGroup(i, m, subMetrics, snaps); err != nil {
			errs = append(errs, err)
		}
	}
	if a.cfg.Peers != nil {
		run, err := newPeers(a.cfg.Peers, a.backends, a.log, a.reg)
		if err != nil {
			errs = append(errs, err)
		} else {
			a.runs = append(a.runs, run)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for model := range snaps {
		a.log.Warn("index snapshot of a model not served, ignored", "model", model)
	}
	return nil
}

// newGroup builds model group i (m): its backend (restored from its part
// of snaps), tokenizer, pool, and its engines: discovery's, or
// router.yaml's added to the pool.
func (a *App) newGroup(i int, m config.Model, subMetrics *kvevents.SubscriberMetrics, snaps map[string]*kvindex.Snapshot) error {
	bc := group.BackendConfig{Model: m.Name, Policy: m.Policy, ShadowServe: m.ShadowServe, Routing: m.Routing, Index: m.Index}
	for _, e := range m.Engines {
		bc.Exact = bc.Exact || e.Events != ""
	}
	if m.Discovery != nil {
		bc.Exact = m.Discovery.Defaults.EventsPort > 0
	} else if bc.Exact {
		warnEnginesWithoutEvents(m, a.log)
	}
	a.exact[m.Name] = bc.Exact
	rtReg := routingprom.Wrap(prometheus.WrapRegistererWith(prometheus.Labels{"model": m.Name}, a.reg))
	b, err := group.NewBackend(bc, a.log, kvindexprom.Wrap(a.reg), rtReg)
	if err != nil {
		return fmt.Errorf("%s: %w", a.pos.Field("models", i), err)
	}
	a.backends[m.Name] = b
	restoreSnapshot(snaps, m.Name, b, a.log)
	ts, err := newTokenSource(m, a.tls.engineClient(), a.log, a.reg)
	if err != nil {
		return fmt.Errorf("%s: %w", a.pos.Field("models", i, "tokenizer"), err)
	}
	parts := &engineParts{model: m.Name, backend: b, tokens: ts, subMet: subMetrics, maxMsg: a.cfg.EventsMaxMessageBytes, log: a.log, reg: a.reg, probes: map[string]*tokenizer.Probe{}, subs: map[string]*kvevents.Subscriber{}}
	p, err := pool.New(pool.Deps{Model: m.Name, Fleet: hookedFleet{Fleet: a.flt, model: m.Name, srv: &a.srvRef}, Replicas: b, Parts: parts.build}, a.log, a.reg)
	if err != nil {
		return err
	}
	a.pools, a.groups = append(a.pools, p), append(a.groups, parts)
	a.runs = append(a.runs, p.Run)
	if m.Discovery != nil {
		run, err := newDiscoveredGroup(m, p, &a.srvRef, a.log, a.reg)
		if err != nil {
			return fmt.Errorf("%s: %w", a.pos.Field("models", i, "discovery"), err)
		}
		a.runs = append(a.runs, run)
		return nil
	}
	a.static[m.Name] = p
	if err := p.Set(staticEngines(m)); err != nil {
		return engineErrors(err, m, i, a.pos)
	}
	return nil
}

// newServer builds the HTTP front (with the /ui page unless o.NoUI) and
// the reloader of o.ConfigPath.
func (a *App) newServer(o Options) error {
	routers := map[string]group.Router{}
	toks := map[string]group.Tokenizer{}
	for _, g := range a.groups {
		routers[g.model] = g.backend
		if g.tokens.failover != nil {
			toks[g.model] = g.tokens.failover
		}
	}
	deps := proxy.Deps{Fleet: a.flt, Routers: routers, Tokenizers: toks, Gatherer: a.reg, EngineTLS: a.tls.engines,
		EventsConnected: a.eventsConnected, Tracing: a.tracing}
	if !o.NoUI {
		a.page = newUI(a.cfg, a.flt, a.reg, &deps)
	}
	srv, err := proxy.New(a.cfg, deps, a.log, a.reg)
	if err != nil {
		return err
	}
	a.srv = srv
	a.srvRef.Store(srv)
	rm, err := newReloadMetrics(a.reg, time.Now())
	if err != nil {
		return err
	}
	rl := &reloader{path: o.ConfigPath, getenv: o.Getenv, override: o.Override, poll: o.Poll, hup: o.Reload,
		log: a.log, m: rm, now: time.Now, running: a.cfg, exact: a.exact, pools: a.static, last: o.ConfigHash}
	rl.running.Models = slices.Clone(a.cfg.Models)
	a.runs = append(a.runs, rl.Run)
	return nil
}

// checkTokenizers runs each engine's tokenizer mismatch probe once: a
// mismatch is an error (the router must not start), an engine that cannot
// be asked is a warning and its probe retries in the background.
func (a *App) checkTokenizers(ctx context.Context) error {
	var probes []*tokenizer.Probe
	for _, g := range a.groups {
		probes = append(probes, g.currentProbes()...)
	}
	for _, p := range probes {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := p.Check(pctx)
		cancel()
		if errors.Is(err, tokenizer.ErrMismatch) {
			return err
		}
		if err != nil {
			a.log.Warn("tokenizer probe could not ask the engine; retrying in the background", "err", err)
		}
	}
	return nil
}

// eventsConnected is proxy.Deps.EventsConnected: it asks the groups'
// subscribers directly (connectedEngines).
func (a *App) eventsConnected() map[string]bool { return connectedEngines(a.groups) }

func (a *App) closePools() {
	for _, p := range a.pools {
		p.Close()
	}
}

func (a *App) stopTracing() {
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.tracing.Shutdown(sctx); err != nil {
		a.log.Warn("tracing: flushing spans at exit", "err", err)
	}
}

// Close releases what New built, for when Run will not be called.
func (a *App) Close() {
	if a.tracing != nil {
		a.stopTracing()
	}
	a.closePools()
	if a.admin != nil {
		a.admin.Close()
	}
}

// TLS reports whether Run serves HTTPS (router.yaml's tls.cert_file).
func (a *App) TLS() bool { return a.tls.listener != nil }

// ListenAdmin opens the admin listener when router.yaml sets admin_listen
// and returns its address (nil when unset); Run then serves /metrics, /ui
// and /v1/route on it.
func (a *App) ListenAdmin() (net.Addr, error) {
	if a.admin != nil {
		return a.admin.Addr(), nil
	}
	if a.cfg.AdminListen == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", a.cfg.AdminListen)
	if err != nil {
		return nil, fmt.Errorf("admin_listen: %w", err)
	}
	a.admin = ln
	return ln.Addr(), nil
}

// Run serves on ln (and on the admin listener, when ListenAdmin opened
// it) until ctx ends, then drains and, with snapshot.path set, writes the
// index snapshot. It owns ln and the admin listener, and returns once
// every goroutine it started has returned.
func (a *App) Run(ctx context.Context, ln net.Listener) error {
	admin := a.admin
	if a.tls.listener != nil {
		ln = tls.NewListener(ln, a.tls.listener)
		if admin != nil {
			admin = tls.NewListener(admin, a.tls.listener)
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(recovered("fleet", func() error { return ignoreCanceled(a.flt.Run(gctx)) }))
	for _, run := range a.runs {
		g.Go(recovered("engines", func() error { return ignoreCanceled(run(gctx)) }))
	}
	g.Go(recovered("proxy", func() error { return a.srv.Run(gctx, ln) }))
	if admin != nil {
		g.Go(recovered("admin", func() error { return a.srv.RunAdmin(gctx, admin) }))
	}
	defer a.stopTracing() // after the drain: the last requests' spans go out
	snap := a.cfg.Snapshot
	g.Go(recovered("snapshot", func() error { return snapshotLoop(gctx, snap, a.backends, a.log) }))
	err := g.Wait()
	if snap.Path != "" {
		// Every subscriber has stopped: the indexes are final.
		if n, serr := writeSnapshot(snap.Path, a.backends); serr != nil {
			a.log.Error("index snapshot on shutdown failed", "err", serr)
		} else {
			a.log.Info("index snapshot written", "path", snap.Path, "entries", n)
		}
	}
	return err
}

// tokenSource is a model's tokenizer: a failover over its engines' token
// sources (nil for "none") and the local tokenizer they share (nil for
// "render").
type tokenSource struct {
	m        config.Model
	failover *group.FailoverTokenizer
	local    *tokenizer.Local
	client   *http.Client
}

// newTokenSource builds a model's tokenizer: none for "none"; else a
// group.FailoverTokenizer that asks the first up engine and fails over on
// connection errors, so one engine down never turns routing into
// load-only routing. Engines join it as the group's pool adds them
// (engineParts): each brings its render endpoints ("render") or, with a
// local tokenizer from the path, that tokenizer with the engine as
// fallback and a mismatch probe of the engine.
func newTokenSource(m config.Model, client *http.Client, log *slog.Logger, reg prometheus.Registerer) (*tokenSource, error) {
	ts := &tokenSource{m: m, client: client}
	if m.Tokenizer == config.TokenizerNone {
		return ts, nil
	}
	if m.Tokenizer != config.TokenizerRender {
		tok, err := tokenizer.Load(m.Tokenizer)
		if err != nil {
			return nil, err
		}
		if ts.local, err = tokenizer.NewLocal(tok, tokenizer.ContentAuto); err != nil {
			return nil, err
		}
		if m.TokenizerPrefixCacheBytes >= 0 {
			cache, err := tokenizer.NewPrefixCache(tokenizer.PrefixCacheConfig{MaxBytes: m.TokenizerPrefixCacheBytes, Model: m.Name}, reg)
			if err != nil {
				return nil, err
			}
			ts.local = ts.local.WithPrefixCache(cache)
		}
	}
	ft, err := group.NewFailoverTokenizer(m.Name, nil, log)
	if err != nil {
		return nil, err
	}
	ts.failover = ft
	return ts, nil
}

// engine builds one engine's token source and, with a local tokenizer, its
// mismatch probe (else nil).
func (ts *tokenSource) engine(ep *fleet.Endpoint, log *slog.Logger, reg prometheus.Registerer) (group.EngineTokenizer, *tokenizer.Probe, error) {
	remote, err := tokenizer.NewRemote(tokenizer.RemoteConfig{URL: ep.URL(), Model: ts.m.Name, Client: ts.client}, log, reg)
	if err != nil {
		return group.EngineTokenizer{}, nil, err
	}
	src, err := tokenizer.NewSource(ts.local, remote)
	if err != nil {
		return group.EngineTokenizer{}, nil, err
	}
	et := group.EngineTokenizer{Endpoint: ep, Tok: admission.TokenSource{Src: src}}
	if ts.local == nil {
		return et, nil, nil
	}
	probe, err := tokenizer.NewProbe(tokenizer.ProbeConfig{Engine: ep.Name(), Reaction: tokenizer.Reaction(ts.m.TokenizerMismatch)}, ts.local, remote, src, log, reg)
	if err != nil {
		return group.EngineTokenizer{}, nil, err
	}
	return et, probe, nil
}

func ignoreCanceled(err error) error {
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// recovered wraps a goroutine's body so that a panic in it comes back as an
// error naming what panicked, with its stack, instead of crashing the
// process (style: no panic crosses a goroutine boundary).
func recovered(what string, f func() error) func() error {
	return func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("%s panicked: %v\n%s", what, r, debug.Stack())
			}
		}()
		return f()
	}
}

// warnEnginesWithoutEvents logs one warning per engine of m listed without
// events while another engine of m has them: the model is then on the
// event-fed index, which never sees that engine's cache, so it serves with
// no predicted hits and /ready does not count it (proxy's readiness). The
// quick form refuses the same mix (one --events per --engine or none);
// router.yaml accepts it, e.g. while an engine's events are being enabled.
func warnEnginesWithoutEvents(m config.Model, log *slog.Logger) {
	for _, e := range m.Engines {
		if e.Events != "" {
			continue
		}
		name := e.Name
		if name == "" {
			name = e.URL
		}
		log.Warn("engine without events in a model on the event-fed index: its cache is never seen (no predicted hits) and /ready does not count it; give it events (vLLM --kv-events-config) or remove events from every engine of the model (the approximate index)",
			"model", m.Name, "engine", name)
	}
}
