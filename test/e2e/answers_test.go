package e2e

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestE2ETooLong: against an engine-sim with max_model_len 2048, a
// 3,000-token prompt is answered by the router with vLLM's 400 and never
// forwarded (too_long: reject, the default), and with too_long: forward the
// engine's own 400 drops the request's predicted blocks at once: the next
// identical prompt is told nothing is cached (before: 2,992 predicted
// cached tokens for the prediction TTL).
func TestE2ETooLong(t *testing.T) {
	e2eLeakCheck(t)
	ids := make([]string, 3000)
	for i := range ids {
		ids[i] = fmt.Sprint(100 + i%5000)
	}
	body := `{"model":"m","max_tokens":8,"prompt":[` + strings.Join(ids, ",") + `]}`
	for _, mode := range []string{"reject", "forward"} {
		t.Run(mode, func(t *testing.T) {
			sim := startE2ESim(t, e2eMaxModelLen(2048))
			// events: an address nobody publishes on, so that the model uses
			// the event-fed index and its predictions (in-process sims
			// publish no events, see e2eSim).
			yaml := fmt.Sprintf("health: {probe_interval: -1s}\nmodels:\n  - name: m\n    tokenizer: none\n    too_long: %s\n    index: {predict_ttl: 1m}\n"+
				"    engines:\n      - {name: e0, url: %q, events: 'tcp://127.0.0.1:%d'}\n", mode, sim.url, e2eFreePort(t))
			r := serveYAML(t, yaml, slog.LevelWarn)
			e2eEventually(t, 10*time.Second, "router up", func() bool {
				resp, err := r.client.Get(r.url + "/health")
				if err == nil {
					resp.Body.Close()
				}
				return err == nil && resp.StatusCode == 200
			})
			if mode == "reject" { // until the fleet's model check has read max_model_len
				e2eEventually(t, 10*time.Second, "max_model_len read", func() bool {
					resp, _ := r.post("/v1/completions", body)
					return resp.StatusCode == 400 && resp.Header.Get("X-Kvrouter-Replica") == ""
				})
			}
			resp, out := r.post("/v1/completions", body)
			if resp.StatusCode != 400 {
				t.Fatalf("status %d: %s", resp.StatusCode, out)
			}
			var e struct {
				Error struct {
					Message, Type string
					Param         *string
				}
			}
			if err := json.Unmarshal([]byte(out), &e); err != nil || e.Error.Type != "BadRequestError" {
				t.Fatalf("not vLLM's error shape: %s", out)
			}
			replica := resp.Header.Get("X-Kvrouter-Replica")
			switch mode {
			case "reject":
				if replica != "" || !strings.Contains(e.Error.Message, "maximum context length is 2048 tokens. However, you requested 8 output tokens and your prompt contains 3000 input tokens") {
					t.Errorf("replica %q, message %q: want the router's answer", replica, e.Error.Message)
				}
			case "forward":
				if replica != "e0" {
					t.Errorf("replica %q: want the engine's answer", replica)
				}
			}
			resp, _ = r.post("/v1/route", body)
			if got := resp.Header.Get("X-Kvrouter-Cached-Tokens"); got != "0" {
				t.Errorf("cached tokens predicted after the rejected request: %s, want 0", got)
			}
		})
	}
}
