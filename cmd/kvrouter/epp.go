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

	"golang.org/x/sync/errgroup"

	"kvrouter/internal/config"
	"kvrouter/internal/epp"
	"kvrouter/internal/proxy"
)

// eppFlags are the parsed flags of "kvrouter epp".
type eppFlags struct {
	serve      serveFlags
	epp        epp.Config
	grpcListen string
}

// parseEPPFlags reads --config FILE (router.yaml, as serve reads it), or
// builds a one-model group from an InferencePool with the quick-form flags.
func parseEPPFlags(args []string, getenv func(string) string, sio stdio) (*eppFlags, error) {
	fs := newFlagSet("epp", "--config router.yaml | --inference-pool NAME --namespace NS --model NAME [...]", sio.err)
	var (
		configFile = fs.String("config", "", "router.yaml (see docs/serve.md and docs/epp.md); excludes the quick-form flags")
		grpcAddr   = fs.String("grpc-listen", ":9002", "ext_proc and gRPC health listen address")
		listen     = fs.String("listen", "", "HTTP listen address for /metrics, /ready, /health and the OpenAI API (default :8080; overrides the file's)")
		maxIF      = fs.Int64("max-in-flight", 0, "requests one endpoint may have open through the EPP before requests are shed with 429 (0: no limit)")
		pool       = fs.String("inference-pool", "", "quick form: the InferencePool (inference.networking.k8s.io/v1) whose Pods are the engines")
		ns         = fs.String("namespace", "", "quick form: the InferencePool's namespace")
		model      = fs.String("model", "", "quick form: the model name clients send")
		tok        = fs.String("tokenizer", "", "quick form: tokenizer.json path or directory, render, or none (default render)")
		policy     = fs.String("policy", "", "quick form: routing policy (default kv)")
		evPort     = fs.Int("events-port", 0, "quick form: engines' KV events port (Pod annotation kvrouter/events-port overrides; 0: none)")
		repPort    = fs.Int("replay-port", 0, "quick form: engines' KV events replay port (Pod annotation kvrouter/replay-port overrides)")
		kubecfg    = fs.String("kubeconfig", "", "quick form: kubeconfig file (default: in-cluster)")
		poll       = fs.Duration("config-poll", defaultConfigPoll, "how often to read --config for a changed content and reload it, as serve does (0: only on SIGHUP)")
		logLevel   slog.Level
	)
	fs.TextVar(&logLevel, "log-level", slog.LevelInfo, "log level: debug, info, warn, error")
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	out := &eppFlags{grpcListen: *grpcAddr, epp: epp.Config{MaxInFlight: *maxIF}}
	out.serve.logLevel, out.serve.getenv, out.serve.poll = logLevel, getenv, *poll
	quick := *pool != "" || *ns != "" || *model != "" || *tok != "" || *policy != "" || *evPort != 0 || *repPort != 0 || *kubecfg != ""
	switch {
	case *configFile != "" && quick:
		return nil, fmt.Errorf("%w: --config excludes --inference-pool, --namespace, --model, --tokenizer, --policy, --events-port, --replay-port, --kubeconfig", errUsage)
	case *configFile != "":
		data, err := os.ReadFile(*configFile)
		if err != nil {
			return nil, err
		}
		cfg, pos, err := config.Parse(data, getenv)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", *configFile, err)
		}
		out.serve.cfg, out.serve.pos = cfg, pos
		out.serve.configPath, out.serve.configHash = *configFile, sha256.Sum256(data)
	default:
		if *pool == "" || *ns == "" || *model == "" {
			return nil, fmt.Errorf("%w: want --config FILE, or --inference-pool NAME, --namespace NS and --model NAME", errUsage)
		}
		d := &config.Discovery{Namespace: *ns, InferencePool: *pool, Kubeconfig: *kubecfg,
			Defaults: config.EngineSettings{EventsPort: *evPort, ReplayPort: *repPort}}
		out.serve.cfg = config.Config{Models: []config.Model{{Name: *model, Tokenizer: *tok, Policy: *policy, Discovery: d}}}
		out.serve.cfg.FillDefaults(getenv)
		if err := out.serve.cfg.Validate(); err != nil {
			return nil, fmt.Errorf("%w: %v", errUsage, err)
		}
	}
	out.serve.override = func(c *config.Config) {
		if *listen != "" {
			c.Listen = *listen
		}
	}
	out.serve.override(&out.serve.cfg)
	if err := out.epp.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	return out, nil
}

// runEPP implements "kvrouter epp": the router's core behind an ext_proc
// endpoint picker, plus its HTTP listener (metrics, readiness, and the
// OpenAI API itself), until ctx ends.
func runEPP(ctx context.Context, args []string, sio stdio) error {
	fl, err := parseEPPFlags(args, os.Getenv, sio)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(sio.err, &slog.HandlerOptions{Level: fl.serve.logLevel}))
	hup := make(chan os.Signal, 1) // a burst of SIGHUPs is one reload
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	fl.serve.hup = hup
	app, err := buildServe(ctx, &fl.serve, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", fl.serve.cfg.Listen)
	if err != nil {
		app.close()
		return err
	}
	gln, err := net.Listen("tcp", fl.grpcListen)
	if err != nil {
		ln.Close()
		app.close()
		return err
	}
	if err := app.listenAdmin(); err != nil {
		ln.Close()
		gln.Close()
		app.close()
		return err
	}
	fmt.Fprintf(sio.err, "kvrouter epp: ext_proc on %s, HTTP on %s\n", gln.Addr(), ln.Addr())
	return runEPPApp(ctx, app, fl, ln, gln, log)
}

// runEPPApp runs a built router with its EPP on gln and HTTP on ln until
// ctx ends. It owns both listeners.
func runEPPApp(ctx context.Context, app *serveApp, fl *eppFlags, ln, gln net.Listener, log *slog.Logger) error {
	var models, replicas []string
	for _, m := range fl.serve.cfg.Models {
		models = append(models, m.Name)
		for _, ep := range app.flt.Endpoints(m.Name) {
			replicas = append(replicas, ep.Name())
		}
	}
	picker := app.srv.Picker()
	srv, err := epp.New(fl.epp, epp.Deps{Picker: picker, Models: models, Replicas: replicas, Ready: func() bool { return eppReady(app, picker) }}, log, app.reg)
	if err != nil {
		ln.Close()
		gln.Close()
		app.close()
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(recovered("router", func() error { return app.run(gctx, ln) }))
	g.Go(recovered("epp", func() error { return srv.Run(gctx, gln) }))
	return g.Wait()
}

// eppReady is the EPP's readiness: what GET /ready says (every model has
// an engine up and probed, which for a discovered group means its source
// has synced and listed one), and for each model on the event-fed index an
// engine of it with its KV event stream connected.
func eppReady(app *serveApp, p *proxy.Picker) bool {
	if !p.Ready() {
		return false
	}
	conn := connectedEngines(app.groups)
	for model, exact := range app.exact {
		if !exact {
			continue
		}
		ok := false
		for _, ep := range app.flt.Endpoints(model) {
			ok = ok || conn[ep.Name()]
		}
		if !ok {
			return false
		}
	}
	return true
}
