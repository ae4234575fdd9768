package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"kvrouter/internal/audit"
)

const auditSynopsis = "(--prometheus URL [--window 1h] [--selector 'job=\"vllm\"'] | --engine URL... [--window 1m]) [--json]"

// runAudit implements "kvrouter audit": does this fleet's traffic deserve
// a KV-aware router? From a Prometheus API or the engines' /metrics
// (internal/audit).
func runAudit(ctx context.Context, args []string, sio stdio) error {
	fs := newFlagSet("audit", auditSynopsis, sio.err)
	prom := fs.String("prometheus", "", "Prometheus HTTP API base URL that scrapes the engines, e.g. http://prometheus:9090")
	window := fs.Duration("window", 0, "window: the counters' increase over it (default 1h with --prometheus, 1m sampling engines)")
	selector := fs.String("selector", "", `extra label matchers for the vLLM series, e.g. job="vllm" (with --prometheus)`)
	samples := fs.Int("samples", 6, "scrapes of each engine spread over the window (without --prometheus)")
	var engines listFlag
	fs.Var(&engines, "engine", "engine base URL to sample directly, e.g. http://10.0.0.1:8000 (repeatable)")
	asJSON := fs.Bool("json", false, "print JSON instead of text")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var (
		r   audit.Report
		err error
	)
	switch {
	case *prom != "" && len(engines) > 0:
		return fmt.Errorf("%w: --prometheus and --engine exclude each other", errUsage)
	case *prom != "":
		w := *window
		if w == 0 {
			w = time.Hour
		}
		r, err = audit.FromPrometheus(ctx, audit.PromConfig{URL: *prom, Window: w, Selector: *selector})
	case len(engines) > 0:
		w := *window
		if w == 0 {
			w = time.Minute
		}
		fmt.Fprintf(sio.err, "sampling %d engines for %s...\n", len(engines), w)
		r, err = audit.FromEngines(ctx, audit.SampleConfig{Engines: engines, Window: w, Samples: *samples})
	default:
		return fmt.Errorf("%w: give --prometheus URL or --engine URL", errUsage)
	}
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(sio.out)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	return r.WriteText(sio.out)
}
