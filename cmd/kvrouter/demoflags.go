package main

import (
	"context"

	"kvrouter/internal/demo"
)

// runDemo implements "kvrouter demo" (internal/demo): 4 engine-sims and a
// kvrouter on loopback, a time-compressed slice of the embedded Mooncake
// trace replayed once per policy from cold caches, then the comparison
// table and an HTML report.
func runDemo(ctx context.Context, args []string, sio stdio) error {
	fs := newFlagSet("demo", "[flags]\n\nStarts 4 engine-sims (HTTP and ZeroMQ KV events on loopback) and a kvrouter per\npolicy in this process, replays a time-compressed slice of the embedded Mooncake\nconversation trace through each, prints the comparison and writes an HTML report.", sio.err)
	policies := fs.String("policies", "round_robin,kv", "comma-separated router policies to compare, each from cold engines (kvrouter's policies, e.g. round_robin, least_load, kv, dynamo, llmd, sglang)")
	var cfg demo.Config
	fs.IntVar(&cfg.Engines, "engines", 4, "engine-sims to start")
	fs.IntVar(&cfg.Requests, "requests", 500, "Mooncake records to replay")
	fs.IntVar(&cfg.Skip, "skip", 1000, "Mooncake records to skip first (the default slice has more reuse within the engines' reach than the trace's start)")
	fs.Float64Var(&cfg.Speed, "speed", 0, "trace time compression (0: 10 x --engines / 4, matching the engines' 10x faster timing)")
	fs.IntVar(&cfg.Blocks, "num-gpu-blocks", 27000, "engine KV cache size in 16-token blocks (27000: the h100 profile's)")
	fs.IntVar(&cfg.MaxOutput, "max-output-tokens", 128, "cap on output lengths (keeps the stream volume within the time budget)")
	fs.StringVar(&cfg.HTML, "html", "kvrouter-demo.html", "HTML report file (empty: none)")
	fs.BoolVar(&cfg.JSON, "json", false, "print the report as JSON instead of a markdown table")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg.Policies = splitList(*policies)
	var err error
	if cfg.Trace, err = readTrace(""); err != nil {
		return err
	}
	return demo.Run(ctx, cfg, sio.out, sio.err)
}
