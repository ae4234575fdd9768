package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"kvrouter/internal/vllm/kvevents"
	"log/slog"
	"strconv"
	"strings"

	"kvrouter/internal/vllm"
)

const eventsSynopsis = "--endpoint tcp://HOST:PORT [--replay tcp://HOST:PORT] [--topic T] [--dp-size N] [--bind] [--queue N] [--count N] [--json]"

// runEvents implements "kvrouter events": it subscribes to one engine's KV
// events (all its data-parallel ranks), with sequence checks and replay, and
// prints each event. With --json every event is one line
//
//	{"seq":3,"rank":0,"ts":1754530955.5,"type":"BlockStored","block_hashes":["11","12"],...}
//
// carrying all of the event type's fields under vLLM's snake_case names
// (absent ones as null; hashes as decimal strings since they may exceed
// 2^53), and on exit (--count events printed, or interrupted) one last line
// {"stats":{...}} with the subscriber's totals. Resets (engine restart, lost
// gap, overflow) are reported on stderr.
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

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := bufio.NewWriter(sio.out)
	p := eventPrinter{w: w, json: *jsonOut}
	printed := 0
	var werr error
	runErr := sub.Run(ctx, func(u kvevents.Update) {
		if werr != nil || (*count > 0 && printed >= *count) {
			return
		}
		if u.Reset != kvevents.ResetNone {
			log.Warn("state reset: a consumer must drop this engine rank's blocks", "rank", u.Rank, "seq", u.Seq, "reason", u.Reset.String())
		}
		for i := range u.Batch.Events {
			p.print(u, &u.Batch.Events[i])
			if printed++; *count > 0 && printed >= *count {
				cancel()
				break
			}
		}
		if werr = w.Flush(); werr != nil {
			cancel()
		}
	})
	p.stats(sub.Stats(), printed)
	if err := w.Flush(); err != nil && werr == nil {
		werr = err
	}
	if runErr != nil {
		return runErr
	}
	if werr != nil {
		return fmt.Errorf("write output: %w", werr)
	}
	return nil
}

// eventPrinter writes events as JSON lines or one readable line each.
type eventPrinter struct {
	w    io.Writer
	json bool
}

// eventHeader starts every --json event line. Each event type has its own
// line type, with the fields of that type in vLLM's declaration order;
// fields that belong to the type but are absent on the wire are null.
type eventHeader struct {
	Seq  uint64  `json:"seq"`
	Rank int     `json:"rank"`
	TS   float64 `json:"ts"`
	Type string  `json:"type"`
}

type storedJSON struct {
	eventHeader
	BlockHashes              []string `json:"block_hashes"`
	ParentBlockHash          *string  `json:"parent_block_hash"`
	TokenIDs                 []uint32 `json:"token_ids"`
	BlockSize                int      `json:"block_size"`
	LoRAID                   *int64   `json:"lora_id"`
	Medium                   *string  `json:"medium"`
	LoRAName                 *string  `json:"lora_name"`
	ExtraKeys                [][]any  `json:"extra_keys"`
	GroupIdx                 *int     `json:"group_idx"`
	KVCacheSpecKind          *string  `json:"kv_cache_spec_kind"`
	KVCacheSpecSlidingWindow *int     `json:"kv_cache_spec_sliding_window"`
	Locality                 *string  `json:"locality"`
}

type removedJSON struct {
	eventHeader
	BlockHashes []string `json:"block_hashes"`
	Medium      *string  `json:"medium"`
	GroupIdx    *int     `json:"group_idx"`
	Locality    *string  `json:"locality"`
}

func hashStrings(hs []vllm.BlockHash) []string {
	if hs == nil {
		return nil
	}
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = strconv.FormatUint(uint64(h), 10)
	}
	return out
}

// nullable maps "" (absent on the wire) to nil.
func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func (p *eventPrinter) print(u kvevents.Update, e *vllm.Event) {
	if !p.json {
		p.text(u, e)
		return
	}
	h := eventHeader{Seq: u.Seq, Rank: u.Rank, TS: u.Batch.TS, Type: e.Type.String()}
	var j any = h
	switch e.Type {
	case vllm.BlockStored:
		s := &storedJSON{
			eventHeader: h, BlockHashes: hashStrings(e.BlockHashes), TokenIDs: e.TokenIDs, BlockSize: e.BlockSize,
			LoRAID: e.LoRAID, Medium: nullable(e.Medium), LoRAName: e.LoRAName, ExtraKeys: e.ExtraKeys,
			GroupIdx: e.GroupIdx, KVCacheSpecKind: nullable(e.KVCacheSpecKind),
			KVCacheSpecSlidingWindow: e.KVCacheSpecSlidingWindow, Locality: nullable(e.Locality),
		}
		if e.ParentBlockHash != nil {
			ph := strconv.FormatUint(uint64(*e.ParentBlockHash), 10)
			s.ParentBlockHash = &ph
		}
		j = s
	case vllm.BlockRemoved:
		j = &removedJSON{eventHeader: h, BlockHashes: hashStrings(e.BlockHashes), Medium: nullable(e.Medium),
			GroupIdx: e.GroupIdx, Locality: nullable(e.Locality)}
	}
	b, err := json.Marshal(j)
	if err != nil { // only an extra key of a type JSON cannot carry
		b, _ = json.Marshal(map[string]any{"seq": u.Seq, "rank": u.Rank, "type": h.Type, "error": err.Error()})
	}
	p.w.Write(append(b, '\n'))
}

// text prints e.g.
// "seq=3 rank=0 ts=1754530955.500 BlockStored hashes=[11 12] parent=- tokens=8 block_size=4 medium=GPU".
func (p *eventPrinter) text(u kvevents.Update, e *vllm.Event) {
	var sb strings.Builder
	fmt.Fprintf(&sb, "seq=%d rank=%d ts=%.3f %s", u.Seq, u.Rank, u.Batch.TS, e.Type)
	if e.Type != vllm.AllBlocksCleared {
		sb.WriteString(" hashes=" + strings.Join(hashStrings(e.BlockHashes), ","))
	}
	if e.Type == vllm.BlockStored {
		parent := "-"
		if e.ParentBlockHash != nil {
			parent = strconv.FormatUint(uint64(*e.ParentBlockHash), 10)
		}
		fmt.Fprintf(&sb, " parent=%s tokens=%d block_size=%d", parent, len(e.TokenIDs), e.BlockSize)
		if e.LoRAName != nil {
			fmt.Fprintf(&sb, " lora=%q", *e.LoRAName)
		}
	}
	if e.Type != vllm.AllBlocksCleared {
		fmt.Fprintf(&sb, " medium=%s", e.Tier())
		if e.GroupIdx != nil {
			fmt.Fprintf(&sb, " group=%d", *e.GroupIdx)
		}
		if e.KVCacheSpecKind != "" {
			fmt.Fprintf(&sb, " kind=%s", e.KVCacheSpecKind)
		}
	}
	sb.WriteByte('\n')
	io.WriteString(p.w, sb.String())
}

// stats prints the final totals.
func (p *eventPrinter) stats(st kvevents.SubscriberStats, printed int) {
	if p.json {
		b, _ := json.Marshal(struct {
			Stats any `json:"stats"`
		}{struct {
			Printed int `json:"printed"`
			kvevents.SubscriberStats
		}{printed, st}})
		p.w.Write(append(b, '\n'))
		return
	}
	fmt.Fprintf(p.w, "stats: printed=%d batches=%d events=%d blocks_stored=%d blocks_removed=%d gaps=%d replays=%d replay_errors=%d unrecoverable_gaps=%d restarts=%d queue_drops=%d malformed=%d duplicates=%d reconnects=%d\n",
		printed, st.Batches, st.Events, st.BlocksStored, st.BlocksRemoved, st.Gaps, st.Replays, st.ReplayErrors,
		st.UnrecoverableGaps, st.Restarts, st.QueueDrops, st.Malformed, st.Duplicates, st.Reconnects)
}
