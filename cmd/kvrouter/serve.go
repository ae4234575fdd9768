package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"

	"kvrouter/internal/config"
	"kvrouter/internal/fleet"
	"kvrouter/internal/group"
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

// serveFlags are the parsed flags of "kvrouter serve".
type serveFlags struct {
	cfg      config.Config
	pos      config.Positions
	logLevel slog.Level
	// configPath is --config ("" for the quick form); configHash is the
	// SHA-256 of the content cfg was read from.
	configPath string
	configHash [32]byte
	// getenv and override (the command line's --listen, --tls-*, applied
	// to cfg) serve reloads of configPath.
	getenv   func(string) string
	override func(*config.Config)
	// poll is how often configPath is read for a change (<= 0: never).
	poll time.Duration
	// hup receives SIGHUP (nil: none).
	hup  <-chan os.Signal
	noUI bool // --ui=false: no /ui page
}

// parseServeFlags reads --config FILE, or builds a one-model configuration
// from the quick-form flags.
func parseServeFlags(args []string, getenv func(string) string, sio stdio) (*serveFlags, error) {
	fs := newFlagSet("serve", "--config router.yaml | --model NAME --engine URL [--events tcp://..] [--replay tcp://..] ...", sio.err)
	var (
		configFile = fs.String("config", "", "router.yaml (see docs/serve.md); excludes the quick-form flags")
		listen     = fs.String("listen", "", "listen address (default :8080; overrides the file's)")
		model      = fs.String("model", "", "quick form: the model name clients send")
		tok        = fs.String("tokenizer", "", "quick form: tokenizer.json path or directory, render (ask the engine), or none (default render)")
		policy     = fs.String("policy", "", "quick form: routing policy: kv (default), round_robin, random, least_load, session, prefix_chars, dynamo, llmd, sglang, shadow")
		engines    listFlag
		events     listFlag
		replays    listFlag
		logLevel   slog.Level
		noHitRepo  = fs.Bool("no-hit-report", false, "quick form: do not merge vllm_xargs.kv_cache_report_mode=full into requests")
		evBind     = fs.Bool("events-bind", false, "quick form: kvrouter binds every --events address and the engines dial in (their endpoint names kvrouter's host)")
		tlsCert    = fs.String("tls-cert", "", "serve HTTPS with this PEM certificate (chain) file; needs --tls-key (overrides the file's tls.cert_file)")
		tlsKey     = fs.String("tls-key", "", "PEM private key of --tls-cert (overrides the file's tls.key_file)")
		engineCA   = fs.String("engine-ca", "", "PEM CA file that verifies https:// engines instead of the system's roots (overrides the file's tls.engine_ca_file)")
		evQueue    = fs.Int("events-queue", 0, "quick form: KV event batches per engine that may wait for the index (default 1024; more are caught up by replay)")
		poll       = fs.Duration("config-poll", defaultConfigPoll, "how often to read --config for a changed content and reload it (0: only on SIGHUP)")
		admin      = fs.String("admin-listen", "", "serve /metrics, /ui and /v1/route on this second address only, e.g. 127.0.0.1:9090 (overrides the file's admin_listen)")
		maxConns   = fs.Int("max-connections", 0, "open client connections per listener (default 8192; overrides the file's http.max_connections)")
		hdrTO      = fs.Duration("header-timeout", 0, "wait for a request's headers (default 10s; overrides http.header_timeout)")
		bodyTO     = fs.Duration("body-idle-timeout", 0, "wait for each next part of a request body (default 30s; overrides http.body_idle_timeout)")
		idleTO     = fs.Duration("idle-timeout", 0, "close a keep-alive connection idle this long (default 60s; overrides http.idle_timeout)")
	)
	fs.Var(&engines, "engine", "quick form: engine base URL, e.g. http://10.0.0.1:8000 (repeatable)")
	fs.Var(&events, "events", "quick form: KV events endpoint of the n-th --engine, e.g. tcp://10.0.0.1:5557 (repeatable, in --engine order)")
	fs.Var(&replays, "replay", "quick form: replay endpoint of the n-th --engine, e.g. tcp://10.0.0.1:5600 (repeatable, in --engine order)")
	fs.TextVar(&logLevel, "log-level", slog.LevelInfo, "log level: debug, info, warn, error")
	uiOn := fs.Bool("ui", true, "serve the live fleet page on /ui (API key required when api_key is set)")
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	out := &serveFlags{logLevel: logLevel, getenv: getenv, poll: *poll, noUI: !*uiOn}
	quick := *model != "" || len(engines) > 0 || len(events) > 0 || len(replays) > 0 || *tok != "" || *policy != "" || *noHitRepo || *evBind || *evQueue != 0
	switch {
	case *configFile != "" && quick:
		return nil, fmt.Errorf("%w: --config excludes --model, --engine, --events, --events-bind, --events-queue, --replay, --tokenizer, --policy", errUsage)
	case *configFile != "":
		data, err := os.ReadFile(*configFile)
		if err != nil {
			return nil, err
		}
		cfg, pos, err := config.Parse(data, getenv)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", *configFile, err)
		}
		out.cfg, out.pos = cfg, pos
		out.configPath, out.configHash = *configFile, sha256.Sum256(data)
	default:
		if *model == "" || len(engines) == 0 {
			return nil, fmt.Errorf("%w: want --config FILE, or --model NAME and at least one --engine URL", errUsage)
		}
		if len(events) > len(engines) || len(replays) > len(engines) {
			return nil, fmt.Errorf("%w: more --events or --replay than --engine (the n-th belongs to the n-th engine)", errUsage)
		}
		// With some engines on events the model uses the event-fed index, which
		// never sees an engine without them: fewer --events than --engine is a
		// slip, not a choice (none at all is: the approximate index). Likewise
		// --replay, which needs --events.
		if len(events) > 0 && len(events) < len(engines) {
			return nil, fmt.Errorf("%w: %d --events for %d --engine: give one --events per --engine, in --engine order, or none (the approximate index)", errUsage, len(events), len(engines))
		}
		if len(replays) > 0 && len(replays) < len(engines) {
			return nil, fmt.Errorf("%w: %d --replay for %d --engine: give one --replay per --engine, in --engine order, or none", errUsage, len(replays), len(engines))
		}
		m := config.Model{Name: *model, Tokenizer: *tok, Policy: *policy, DisableHitReport: *noHitRepo}
		for i, u := range engines {
			e := config.Engine{URL: u, EventsQueue: *evQueue}
			if i < len(events) {
				e.Events, e.EventsBind = events[i], *evBind
			}
			if i < len(replays) {
				e.Replay = replays[i]
			}
			m.Engines = append(m.Engines, e)
		}
		out.cfg = config.Config{Models: []config.Model{m}}
		out.cfg.FillDefaults(getenv)
		if err := out.cfg.Validate(); err != nil {
			return nil, fmt.Errorf("%w: %v", errUsage, err)
		}
	}
	out.override = func(c *config.Config) {
		if *listen != "" {
			c.Listen = *listen
		}
		if *tlsCert != "" || *tlsKey != "" {
			c.TLS.CertFile, c.TLS.KeyFile = *tlsCert, *tlsKey
		}
		if *engineCA != "" {
			c.TLS.EngineCAFile = *engineCA
		}
		if *admin != "" {
			c.AdminListen = *admin
		}
		if *maxConns > 0 {
			c.HTTP.MaxConnections = *maxConns
		}
		for _, d := range []struct {
			flag time.Duration
			dst  *time.Duration
		}{{*hdrTO, &c.HTTP.HeaderTimeout}, {*bodyTO, &c.HTTP.BodyIdleTimeout}, {*idleTO, &c.HTTP.IdleTimeout}} {
			if d.flag > 0 {
				*d.dst = d.flag
			}
		}
	}
	out.override(&out.cfg)
	return out, nil
}

// runServe implements "kvrouter serve": it serves until ctx ends, then
// drains.
func runServe(ctx context.Context, args []string, sio stdio) error {
	fl, err := parseServeFlags(args, os.Getenv, sio)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(sio.err, &slog.HandlerOptions{Level: fl.logLevel}))
	hup := make(chan os.Signal, 1) // a burst of SIGHUPs is one reload
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	fl.hup = hup
	// Everything that can reject the configuration runs before the socket
	// opens: a start-up error never follows "listening on".
	app, err := buildServe(ctx, fl, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", fl.cfg.Listen)
	if err != nil {
		app.close()
		return err
	}
	if err := app.listenAdmin(); err != nil {
		ln.Close()
		app.close()
		return err
	}
	scheme := "http"
	if app.tls {
		scheme = "https"
	}
	fmt.Fprintf(sio.err, "kvrouter serve: listening on %s://%s\n", scheme, ln.Addr())
	if app.admin != nil {
		fmt.Fprintf(sio.err, "kvrouter serve: admin listening on %s://%s\n", scheme, app.admin.Addr())
	}
	return app.run(ctx, ln)
}

// serve builds the router (buildServe) and runs it on ln until ctx ends. It
// owns ln.
func serve(ctx context.Context, fl *serveFlags, ln net.Listener, log *slog.Logger) error {
	app, err := buildServe(ctx, fl, log)
	if err != nil {
		ln.Close()
		return err
	}
	if err := app.listenAdmin(); err != nil {
		ln.Close()
		app.close()
		return err
	}
	return app.run(ctx, ln)
}

// serveApp is a built router, not yet serving.
type serveApp struct {
	// run serves on ln (and admin, when listenAdmin opened it) until ctx
	// ends, then drains; it owns ln and admin.
	run func(ctx context.Context, ln net.Listener) error
	// adminAddr is router.yaml's admin_listen; admin its listener once
	// listenAdmin opened it.
	adminAddr string
	admin     net.Listener
	// close releases what was built when run will not be called.
	close func()
	// tls: run serves HTTPS.
	tls bool
	// srv is the HTTP front (its Picker routes for the EPP); reg the
	// registry of every collector; flt the fleet; exact the models on the
	// event-fed index.
	srv   *proxy.Server
	reg   *prometheus.Registry
	flt   *fleet.Fleet
	exact map[string]bool
	// groups are the model groups' engine parts (their subscribers, for
	// readiness).
	groups []*engineParts
}

// buildServe wires the fleet, one routing backend per model, the event
// subscribers, the tokenizers (with their mismatch check against the
// engine) and the HTTP server, starting nothing; every configuration error
// is returned here, before anything listens.
func buildServe(ctx context.Context, fl *serveFlags, log *slog.Logger) (*serveApp, error) {
	cfg := fl.cfg
	tlsCfg, err := loadServeTLS(cfg.TLS)
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	backends := map[string]*group.Backend{} // written before anything runs, then only read
	var fcfg fleet.Config
	var errs []error
	for _, m := range cfg.Models {
		fcfg.Models = append(fcfg.Models, m.Name) // engines join through the groups' pools
	}
	h := cfg.Health
	fcfg.ProbeInterval, fcfg.ProbeTimeout, fcfg.ScrapeInterval = h.ProbeInterval, h.ProbeTimeout, h.ScrapeInterval
	fcfg.EjectAfterServerErrors, fcfg.EjectAfterBackpressure = h.EjectAfterServerErrors, h.EjectAfterBackpressure
	fcfg.BackoffBase, fcfg.BackoffMax = h.BackoffBase, h.BackoffMax
	fcfg.EjectAfterProbeTimeouts, fcfg.PanicThreshold, fcfg.ModelsInterval = h.EjectAfterProbeTimeouts, h.PanicThreshold, h.ModelsInterval
	fcfg.StallAfter = h.StallAfter
	fcfg.TLS = tlsCfg.engines
	var page *ui.UI // set once the fleet exists, before anything runs
	fcfg.OnMetrics = func(ep *fleet.Endpoint, m enginemetrics.Metrics) {
		if page != nil {
			page.Observe(ep.Name(), m)
		}
		for _, model := range ep.Models() {
			if b := backends[model]; b != nil {
				b.Observe(ep.Name(), m, time.Now())
			}
		}
	}
	fcfg.OnRestart = func(ep *fleet.Endpoint) {
		// The path a kvevents reset takes: drop every rank's entries.
		for _, model := range ep.Models() {
			if b := backends[model]; b != nil {
				for r := range b.DPSize(ep.Name()) {
					b.Apply(kvevents.Update{Engine: ep.Name(), Rank: r, Reset: kvevents.ResetRestart, NoBatch: true})
				}
			}
		}
	}
	flt, err := fleet.New(fcfg, log, reg)
	if err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}

	subMetrics, err := kvevents.NewSubscriberMetrics(reg)
	if err != nil {
		return nil, err
	}
	ixReg := kvindexprom.Wrap(reg)
	var runs []func(context.Context) error
	var pools []*pool.Pool
	static := map[string]*pool.Pool{} // the groups whose engines router.yaml lists
	exact := map[string]bool{}
	var srvRef atomic.Pointer[proxy.Server]
	var groups []*engineParts
	routers := map[string]group.Router{}
	toks := map[string]group.Tokenizer{}
	snaps := readSnapshot(cfg.Snapshot.Path, log)
	for i, m := range cfg.Models {
		bc := group.BackendConfig{Model: m.Name, Policy: m.Policy, ShadowServe: m.ShadowServe, Routing: m.Routing, Index: m.Index}
		for _, e := range m.Engines {
			bc.Exact = bc.Exact || e.Events != ""
		}
		if m.Discovery != nil {
			bc.Exact = m.Discovery.Defaults.EventsPort > 0
		} else if bc.Exact {
			warnEnginesWithoutEvents(m, log)
		}
		exact[m.Name] = bc.Exact
		rtReg := routingprom.Wrap(prometheus.WrapRegistererWith(prometheus.Labels{"model": m.Name}, reg))
		b, err := group.NewBackend(bc, log, ixReg, rtReg)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", fl.pos.Field("models", i), err))
			continue
		}
		backends[m.Name], routers[m.Name] = b, b
		restoreSnapshot(snaps, m.Name, b, log)
		ts, err := newTokenSource(m, tlsCfg.engineClient(), log, reg)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", fl.pos.Field("models", i, "tokenizer"), err))
			continue
		}
		if ts.failover != nil {
			toks[m.Name] = ts.failover
		}
		parts := &engineParts{model: m.Name, backend: b, tokens: ts, subMet: subMetrics, maxMsg: cfg.EventsMaxMessageBytes, log: log, reg: reg, probes: map[string]*tokenizer.Probe{}, subs: map[string]*kvevents.Subscriber{}}
		p, err := pool.New(pool.Deps{Model: m.Name, Fleet: hookedFleet{Fleet: flt, model: m.Name, srv: &srvRef}, Replicas: b, Parts: parts.build}, log, reg)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		pools, groups = append(pools, p), append(groups, parts)
		runs = append(runs, p.Run)
		if m.Discovery != nil {
			run, err := newDiscoveredGroup(m, p, &srvRef, log, reg)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", fl.pos.Field("models", i, "discovery"), err))
				continue
			}
			runs = append(runs, run)
			continue
		}
		static[m.Name] = p
		if err := p.Set(staticEngines(m)); err != nil {
			errs = append(errs, engineErrors(err, m, i, fl))
		}
	}
	if cfg.Peers != nil {
		run, err := newPeers(cfg.Peers, backends, log, reg)
		if err != nil {
			errs = append(errs, err)
		} else {
			runs = append(runs, run)
		}
	}
	closePools := func() {
		for _, p := range pools {
			p.Close()
		}
	}
	if err := errors.Join(errs...); err != nil {
		closePools()
		return nil, err
	}
	for model := range snaps {
		log.Warn("index snapshot of a model not served, ignored", "model", model)
	}
	tr, err := tracing.FromEnv(ctx, os.Getenv, buildVersion())
	if err != nil {
		closePools()
		return nil, err
	}
	if tr.Enabled {
		log.Info("tracing on: OTLP export (OTEL_* environment)", "protocol", tr.Protocol)
	}
	stopTracing := func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := tr.Shutdown(sctx); err != nil {
			log.Warn("tracing: flushing spans at exit", "err", err)
		}
	}
	deps := proxy.Deps{Fleet: flt, Routers: routers, Tokenizers: toks, Gatherer: reg, EngineTLS: tlsCfg.engines,
		EventsConnected: func() map[string]bool { return connectedEngines(groups) }, Tracing: tr}
	if !fl.noUI {
		page = newUI(cfg, flt, reg, &deps)
	}
	srv, err := proxy.New(cfg, deps, log, reg)
	if err != nil {
		stopTracing()
		closePools()
		return nil, err
	}
	srvRef.Store(srv)
	rm, err := newReloadMetrics(reg, time.Now())
	if err != nil {
		stopTracing()
		closePools()
		return nil, err
	}
	rl := &reloader{path: fl.configPath, getenv: fl.getenv, override: fl.override, poll: fl.poll, hup: fl.hup,
		log: log, m: rm, now: time.Now, running: cfg, exact: exact, pools: static, last: fl.configHash}
	rl.running.Models = slices.Clone(cfg.Models)
	runs = append(runs, rl.Run)
	var probes []*tokenizer.Probe
	for _, g := range groups {
		probes = append(probes, g.currentProbes()...)
	}
	for _, p := range probes {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := p.Check(pctx)
		cancel()
		if errors.Is(err, tokenizer.ErrMismatch) {
			stopTracing()
			closePools()
			return nil, err
		}
		if err != nil {
			log.Warn("tokenizer probe could not ask the engine; retrying in the background", "err", err)
		}
	}

	app := &serveApp{tls: tlsCfg.listener != nil, srv: srv, reg: reg, flt: flt, exact: exact, groups: groups, adminAddr: cfg.AdminListen}
	app.close = func() {
		stopTracing()
		closePools()
		if app.admin != nil {
			app.admin.Close()
		}
	}
	app.run = func(ctx context.Context, ln net.Listener) error {
		admin := app.admin
		if tlsCfg.listener != nil {
			ln = tls.NewListener(ln, tlsCfg.listener)
			if admin != nil {
				admin = tls.NewListener(admin, tlsCfg.listener)
			}
		}
		g, gctx := errgroup.WithContext(ctx)
		g.Go(recovered("fleet", func() error { return ignoreCanceled(flt.Run(gctx)) }))
		for _, run := range runs {
			g.Go(recovered("engines", func() error { return ignoreCanceled(run(gctx)) }))
		}
		g.Go(recovered("proxy", func() error { return srv.Run(gctx, ln) }))
		if admin != nil {
			g.Go(recovered("admin", func() error { return srv.RunAdmin(gctx, admin) }))
		}
		defer stopTracing() // after the drain: the last requests' spans go out
		g.Go(recovered("snapshot", func() error { return snapshotLoop(gctx, cfg.Snapshot, backends, log) }))
		err := g.Wait()
		if cfg.Snapshot.Path != "" {
			// Every subscriber has stopped: the indexes are final.
			if n, serr := writeSnapshot(cfg.Snapshot.Path, backends); serr != nil {
				log.Error("index snapshot on shutdown failed", "err", serr)
			} else {
				log.Info("index snapshot written", "path", cfg.Snapshot.Path, "entries", n)
			}
		}
		return err
	}
	return app, nil
}

// listenAdmin opens the admin listener when admin_listen is set.
func (a *serveApp) listenAdmin() error {
	if a.adminAddr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", a.adminAddr)
	if err != nil {
		return fmt.Errorf("admin_listen: %w", err)
	}
	a.admin = ln
	return nil
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
	et := group.EngineTokenizer{Endpoint: ep, Tok: proxy.TokenSource{Src: src}}
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
