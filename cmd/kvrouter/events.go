package main

import (
	"context"
	"fmt"
	"log/slog"

	"kvrouter/internal/vllm/kvevents"
	"kvrouter/internal/vllm/kvevents/tail"
)

const eventsSynopsis = "--endpoint tcp://HOST:PORT [--replay tcp://HOST:PORT] [--topic T] [--dp-size N] [--bind] [--queue N] [--count N] [--json]"

// runEvents implements "kvrouter events": it subscribes to one engine's KV
// events (all its data-parallel ranks), with sequence checks and replay, and
// prints each event (internal/vllm/kvevents/tail: --json lines, then the
// subscriber's totals); resets are reported on stderr.
func runEvents(ctx context.Context, args []string, sio stdio) error {
	fs := newFlagSet("events", eventsSynopsis, sio.err)
	endpoint := fs.String("endpoint", "", "the engine's KV event PUB endpoint (kv-events-config \"endpoint\" with the engine's host); with --bind, the local address to bind")
	replay := fs.String("replay", "", "the engine's replay ROUTER endpoint (\"replay_endpoint\"); empty: gaps cannot be filled")
	topic := fs.String("topic", "", "topic prefix to subscribe to (\"topic\"; empty: all)")
	dpSize := fs.Int("dp-size", 1, "data-parallel ranks; rank r publishes on port+r (replay too)")
	bind := fs.Bool("bind", false, "bind --endpoint and let engines connect (when their endpoint names this host)")
	queue := fs.Int("queue", 0, "decoded batches that may wait for printing (default 1024; more are caught up by replay)")
	count := fs.Int("count", 0, "exit after printing N events (0: until interrupted)")
	jsonOut := fs.Bool("json", false, "print one JSON object per event, then a stats object")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *endpoint == "" {
		return fmt.Errorf("%w: --endpoint is required", errUsage)
	}
	if *count < 0 {
		return fmt.Errorf("%w: --count %d: want >= 0", errUsage, *count)
	}
	log := slog.New(slog.NewTextHandler(sio.err, &slog.HandlerOptions{Level: slog.LevelWarn}))
	sub, err := kvevents.NewSubscriber(kvevents.SubscriberConfig{
		Endpoint: *endpoint, ReplayEndpoint: *replay, Topic: *topic, DPSize: *dpSize, Bind: *bind, QueueSize: *queue,
	}, log, nil)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	return tail.Run(ctx, sub, sio.out, tail.Options{JSON: *jsonOut, Count: *count}, log)
}
