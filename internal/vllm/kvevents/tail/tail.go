// Package tail prints an engine's KV events as "kvrouter events" shows
// them: one readable line per event, or with JSON one object per event
//
//	{"seq":3,"rank":0,"ts":1754530955.5,"type":"BlockStored","block_hashes":["11","12"],...}
//
// carrying all of the event type's fields under vLLM's snake_case names
// (absent ones as null; hashes as decimal strings since they may exceed
// 2^53), and on exit one last line {"stats":{...}} with the subscriber's
// totals. It starts no goroutine of its own: Run runs the subscriber.
package tail

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"

	"kvrouter/internal/vllm"
	"kvrouter/internal/vllm/kvevents"
)

// Options are Run's output settings.
type Options struct {
	// JSON prints one JSON object per event, then a stats object.
	JSON bool
	// Count ends Run after printing that many events (0: until ctx ends).
	Count int
}

// Run runs sub until ctx ends or o.Count events are printed, printing each
// event on out and, at the end, the subscriber's totals. State resets
// (engine restart, lost gap, overflow) are logged as warnings on log (nil: discarded). It
// returns the subscriber's error, else a failure to write out.
func Run(ctx context.Context, sub *kvevents.Subscriber, out io.Writer, o Options, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := bufio.NewWriter(out)
	p := eventPrinter{w: w, json: o.JSON}
	printed := 0
	var werr error
	runErr := sub.Run(ctx, func(u kvevents.Update) {
		if werr != nil || (o.Count > 0 && printed >= o.Count) {
			return
		}
		if u.Reset != kvevents.ResetNone {
			log.Warn("state reset: a consumer must drop this engine rank's blocks", "rank", u.Rank, "seq", u.Seq, "reason", u.Reset.String())
		}
		for i := range u.Batch.Events {
			p.print(u, &u.Batch.Events[i])
			if printed++; o.Count > 0 && printed >= o.Count {
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
