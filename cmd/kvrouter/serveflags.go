package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"kvrouter/internal/config"
	"kvrouter/internal/serve"
)

// serveFlags are the parsed flags of "kvrouter serve": the application's
// options (all but Log and Reload, which runServe adds) and the log level.
type serveFlags struct {
	opts     serve.Options
	logLevel slog.Level
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
		poll       = fs.Duration("config-poll", serve.DefaultConfigPoll, "how often to read --config for a changed content and reload it (0: only on SIGHUP)")
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
	out := &serveFlags{logLevel: logLevel, opts: serve.Options{Getenv: getenv, Poll: *poll, NoUI: !*uiOn, Version: buildVersion()}}
	quick := *model != "" || len(engines) > 0 || len(events) > 0 || len(replays) > 0 || *tok != "" || *policy != "" || *noHitRepo || *evBind || *evQueue != 0
	switch {
	case *configFile != "" && quick:
		return nil, fmt.Errorf("%w: --config excludes --model, --engine, --events, --events-bind, --events-queue, --replay, --tokenizer, --policy", errUsage)
	case *configFile != "":
		if err := loadConfigFile(&out.opts, *configFile); err != nil {
			return nil, err
		}
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
		out.opts.Config = config.Config{Models: []config.Model{m}}
		out.opts.Config.FillDefaults(getenv)
		if err := out.opts.Config.Validate(); err != nil {
			return nil, fmt.Errorf("%w: %v", errUsage, err)
		}
	}
	out.opts.Override = func(c *config.Config) {
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
	out.opts.Override(&out.opts.Config)
	return out, nil
}

// runServe implements "kvrouter serve": it serves until ctx ends, then
// drains.
func runServe(ctx context.Context, args []string, sio stdio) error {
	fl, err := parseServeFlags(args, os.Getenv, sio)
	if err != nil {
		return err
	}
	hup := make(chan os.Signal, 1) // a burst of SIGHUPs is one reload
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	app, ln, admin, err := startServe(ctx, fl, hup, sio)
	if err != nil {
		return err
	}
	scheme := "http"
	if app.TLS() {
		scheme = "https"
	}
	fmt.Fprintf(sio.err, "kvrouter serve: listening on %s://%s\n", scheme, ln.Addr())
	if admin != nil {
		fmt.Fprintf(sio.err, "kvrouter serve: admin listening on %s://%s\n", scheme, admin)
	}
	return app.Run(ctx, ln)
}

// startServe builds the application of fl, logging on sio.err and
// reloading on hup, then opens its listener and admin listener (admin nil
// when none): everything that can reject the configuration runs before
// the socket opens, so a start-up error never follows "listening on".
func startServe(ctx context.Context, fl *serveFlags, hup <-chan os.Signal, sio stdio) (*serve.App, net.Listener, net.Addr, error) {
	fl.opts.Log = slog.New(slog.NewTextHandler(sio.err, &slog.HandlerOptions{Level: fl.logLevel}))
	fl.opts.Reload = hup
	app, err := serve.New(ctx, fl.opts)
	if err != nil {
		return nil, nil, nil, err
	}
	ln, err := net.Listen("tcp", fl.opts.Config.Listen)
	if err != nil {
		app.Close()
		return nil, nil, nil, err
	}
	admin, err := app.ListenAdmin()
	if err != nil {
		ln.Close()
		app.Close()
		return nil, nil, nil, err
	}
	return app, ln, admin, nil
}

// loadConfigFile reads router.yaml at path into opts: the configuration,
// its line positions (for reload errors), the path to poll and the hash of
// the content read.
func loadConfigFile(opts *serve.Options, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	cfg, pos, err := config.Parse(data, opts.Getenv)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	opts.Config, opts.Positions = cfg, pos
	opts.ConfigPath, opts.ConfigHash = path, sha256.Sum256(data)
	return nil
}
