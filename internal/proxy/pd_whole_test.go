package proxy

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"kvrouter/internal/config"
	"kvrouter/internal/group"
	"kvrouter/internal/pd"
)

// TestPDWholeOnPrefill: over a slow link (TCP) with both decode engines
// busy (a lease of a long prompt held on each: queued prefill and a request
// in flight), a long prompt is served whole by a prefill engine: one plain
// request there, without kv_transfer_params, no decode leg, path "whole"
// in the header, the metric and /v1/route; every counter returns to zero.
// With whole_max_queue -1 the same request takes one of the two other paths.
func TestPDWholeOnPrefill(t *testing.T) {
	for _, off := range []bool{false, true} {
		t.Run(map[bool]string{false: "on", true: "off"}[off], func(t *testing.T) {
			rg := newPDRig(t, twoByTwo, func(mc *config.Model) {
				mc.PD.Link = "tcp"
				if off {
					mc.PD.WholeMaxQueue = -1
				}
			})
			busy := make([]uint32, 6000)
			for i := range busy {
				busy[i] = uint32(50000 + i)
			}
			for _, d := range []string{"d0", "d1"} {
				dec, err := rg.backend.Route(&group.RouteInput{Model: "m", Tokens: busy, MaxTokens: 500, Candidates: []string{d}})
				if err != nil || dec.Replica != d {
					t.Fatalf("busy lease on %s: %+v %v", d, dec, err)
				}
				defer dec.Release()
			}
			resp := rg.post(context.Background(), "/v1/route", pdPrompt(1, 3000, 3, false))
			var ex struct {
				Path    string     `json:"path"`
				Verdict pd.Verdict `json:"verdict"`
			}
			if err := json.Unmarshal([]byte(readAll(t, resp)), &ex); err != nil {
				t.Fatal(err)
			}
			if off {
				if ex.Path == pathWhole || ex.Verdict.Whole {
					t.Fatalf("whole path taken while off: %+v", ex)
				}
				return
			}
			if ex.Path != pathWhole || ex.Verdict.Reason != pd.ReasonWhole || !ex.Verdict.Whole || ex.Verdict.WholeSeconds <= 0 {
				t.Fatalf("explain %+v, want path whole", ex)
			}
			resp = rg.post(context.Background(), "/v1/completions", pdPrompt(1, 3000, 3, true))
			body := readAll(t, resp)
			if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Kvrouter-Path") != pathWhole ||
				!strings.HasPrefix(resp.Header.Get("X-Kvrouter-Replica"), "p") || !strings.Contains(body, "[DONE]") {
				t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, body)
			}
			if n := rg.engine("d0").requests.Load() + rg.engine("d1").requests.Load(); n != 0 {
				t.Fatalf("%d requests sent to decode engines", n)
			}
			p := rg.engine(resp.Header.Get("X-Kvrouter-Replica"))
			if p.requests.Load() != 1 {
				t.Fatalf("%s got %d requests, want 1", p.name, p.requests.Load())
			}
			var sent map[string]any
			if err := json.Unmarshal(*p.lastBody.Load(), &sent); err != nil {
				t.Fatal(err)
			}
			if _, ok := sent["kv_transfer_params"]; ok || sent["max_tokens"] != float64(3) || sent["stream"] != true {
				t.Fatalf("body sent to the prefill engine: %v", sent)
			}
			if got := rg.pdCount(pathWhole, pd.ReasonWhole); got != 1 {
				t.Fatalf("whole path counted %v, want 1", got)
			}
		})
	}
}

// TestPDWholeConfig: router.yaml's whole_max_queue, strictly parsed: a
// duration, negative for off, 1 s by default.
func TestPDWholeConfig(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want time.Duration
	}{
		{"", time.Second},
		{", whole_max_queue: 300ms", 300 * time.Millisecond},
		{", whole_max_queue: -1s", -time.Second},
	} {
		cfg, _, err := config.Parse([]byte("models:\n  - name: m\n    pd: {mode: conditional"+tc.yaml+"}\n    engines:\n      - {url: \"http://127.0.0.1:1\", role: prefill}\n      - {url: \"http://127.0.0.1:2\", role: decode}\n"), func(string) string { return "" })
		if err != nil {
			t.Fatalf("%q: %v", tc.yaml, err)
		}
		if g := newPDGroup(cfg.Models[0]); g == nil || g.rule.WholeMaxQueue != tc.want {
			t.Fatalf("%q: parsed group %+v, want whole_max_queue %v", tc.yaml, g, tc.want)
		}
	}
}
