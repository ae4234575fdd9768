package group

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"kvrouter/internal/kvindex"
	"kvrouter/internal/vllm"
)

// TestBackendRoutedLogRequestID: the routing package's debug "routed" line
// carries the request id the Backend was given.
func TestBackendRoutedLogRequestID(t *testing.T) {
	logs := &bytes.Buffer{} // Route logs before it returns
	b, err := NewBackend(BackendConfig{Model: "m", Replicas: []string{"a", "b"}, Exact: true},
		slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	d, err := b.Route(&RouteInput{Model: "m", RequestID: "req-42", Tokens: seq(64), Candidates: []string{"a", "b"}})
	if err != nil {
		t.Fatal(err)
	}
	d.Release()
	var routed string
	for l := range strings.Lines(logs.String()) {
		if strings.Contains(l, "msg=routed") {
			routed = l
		}
	}
	if !strings.Contains(routed, "request_id=req-42") {
		t.Fatalf("routed line without the request id: %q\n%s", routed, logs.String())
	}
}

// TestBackendMediaPromptCost: a media prompt routed by load (no Tokens)
// still pays its length in the kv policy's prefill cost
// (RouteInput.PromptTokens), and its items reach the keys: a prompt
// stored with an image's extra keys matches only with those items.
func TestBackendMediaPromptCost(t *testing.T) {
	b := newTestBackend(t, "kv")
	cost := func(in *RouteInput) float64 {
		t.Helper()
		in.Model, in.Candidates, in.DryRun = "m", []string{"a", "b"}, true
		d, err := b.Route(in)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := json.Marshal(d.Explain)
		var ex struct {
			Candidates []struct {
				Cost *float64 `json:"cost"`
			} `json:"candidates"`
		}
		if err := json.Unmarshal(raw, &ex); err != nil || len(ex.Candidates) == 0 || ex.Candidates[0].Cost == nil {
			t.Fatalf("explain %s (%v)", raw, err)
		}
		return *ex.Candidates[0].Cost
	}
	none, visual := cost(&RouteInput{}), cost(&RouteInput{PromptTokens: 1024})
	if !(visual > none) {
		t.Fatalf("cost with 1024 visual tokens %v, without %v: the prompt length must count", visual, none)
	}

	prompt := seq(64)
	ev := stored(prompt, 16)
	item := kvindex.MMItem{Identifier: "img", Offset: 20, Length: 30}
	for i := range ev.Batch.Events[0].BlockHashes {
		ev.Batch.Events[0].ExtraKeys = append(ev.Batch.Events[0].ExtraKeys,
			vllm.BlockExtraKeys(vllm.RequestKeys{MM: []vllm.MMFeature{{Identifier: item.Identifier, Offset: item.Offset, Length: item.Length}}}, i*16, (i+1)*16))
	}
	b.Apply(ev)
	for _, tc := range []struct {
		mm   []kvindex.MMItem
		want int // 48: all 4 blocks, less the last token vLLM always computes
	}{{[]kvindex.MMItem{item}, 48}, {nil, 16}, {[]kvindex.MMItem{{Identifier: "other", Offset: 20, Length: 30}}, 16}} {
		d, err := b.Route(&RouteInput{Model: "m", Tokens: prompt, MM: tc.mm, Candidates: []string{"a", "b"}, DryRun: true})
		if err != nil || d.CachedTokens != tc.want {
			t.Errorf("items %+v: cached %d (%v), want %d", tc.mm, d.CachedTokens, err, tc.want)
		}
	}
}
