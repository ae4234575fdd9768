package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

	"kvrouter/internal/config"
	"kvrouter/internal/epp"
	"kvrouter/internal/serve"
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
		poll       = fs.Duration("config-poll", serve.DefaultConfigPoll, "how often to read --config for a changed content and reload it, as serve does (0: only on SIGHUP)")
		logLevel   slog.Level
	)
	fs.TextVar(&logLevel, "log-level", slog.LevelInfo, "log level: debug, info, warn, error")
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	out := &eppFlags{grpcListen: *grpcAddr, epp: epp.Config{MaxInFlight: *maxIF}}
	out.serve.logLevel, out.serve.opts = logLevel, serve.Options{Getenv: getenv, Poll: *poll, Version: buildVersion()}
	quick := *pool != "" || *ns != "" || *model != "" || *tok != "" || *policy != "" || *evPort != 0 || *repPort != 0 || *kubecfg != ""
	switch {
	case *configFile != "" && quick:
		return nil, fmt.Errorf("%w: --config excludes --inference-pool, --namespace, --model, --tokenizer, --policy, --events-port, --replay-port, --kubeconfig", errUsage)
	case *configFile != "":
		if err := loadConfigFile(&out.serve.opts, *configFile); err != nil {
			return nil, err
		}
	default:
		if *pool == "" || *ns == "" || *model == "" {
			return nil, fmt.Errorf("%w: want --config FILE, or --inference-pool NAME, --namespace NS and --model NAME", errUsage)
		}
		d := &config.Discovery{Namespace: *ns, InferencePool: *pool, Kubeconfig: *kubecfg,
			Defaults: config.EngineSettings{EventsPort: *evPort, ReplayPort: *repPort}}
		out.serve.opts.Config = config.Config{Models: []config.Model{{Name: *model, Tokenizer: *tok, Policy: *policy, Discovery: d}}}
		out.serve.opts.Config.FillDefaults(getenv)
		if err := out.serve.opts.Config.Validate(); err != nil {
			return nil, fmt.Errorf("%w: %v", errUsage, err)
		}
	}
	out.serve.opts.Override = func(c *config.Config) {
		if *listen != "" {
			c.Listen = *listen
		}
	}
	out.serve.opts.Override(&out.serve.opts.Config)
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
	hup := make(chan os.Signal, 1) // a burst of SIGHUPs is one reload
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	app, ln, _, err := startServe(ctx, &fl.serve, hup, sio)
	if err != nil {
		return err
	}
	gln, err := net.Listen("tcp", fl.grpcListen)
	if err != nil {
		ln.Close()
		app.Close()
		return err
	}
	fmt.Fprintf(sio.err, "kvrouter epp: ext_proc on %s, HTTP on %s\n", gln.Addr(), ln.Addr())
	return app.RunEPP(ctx, fl.epp, ln, gln)
}
