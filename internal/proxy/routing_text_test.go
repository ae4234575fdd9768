package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/config"
	"kvrouter/internal/fleet"
	"kvrouter/internal/group"
)

// newTextServer is a Server routing model "m" over n loopback engines with
// the production Backend and policy.
func newTextServer(t *testing.T, n int, policy string) *httptest.Server {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := config.Config{Models: []config.Model{{Name: "m", Tokenizer: config.TokenizerNone}}}
	var fcfg fleet.Config
	fcfg.ProbeInterval, fcfg.ScrapeInterval = -1, -1
	var names []string
	for i := range n {
		e := newEngine(t, fmt.Sprintf("e%d", i))
		names = append(names, e.name)
		cfg.Models[0].Engines = append(cfg.Models[0].Engines, config.Engine{Name: e.name, URL: e.srv.URL})
		fcfg.Endpoints = append(fcfg.Endpoints, fleet.EndpointConfig{Name: e.name, URL: e.srv.URL, Models: []string{"m"}})
	}
	cfg.FillDefaults(func(string) string { return "" })
	fl, err := fleet.New(fcfg, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	be, err := group.NewBackend(group.BackendConfig{Model: "m", Replicas: names, Policy: policy}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(cfg, Deps{Fleet: fl, Routers: map[string]group.Router{"m": be}}, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		front.Close()
		srv.closeIdle()
	})
	return front
}

// TestPrefixCharsRoutesChat: through the proxy, chat requests sharing a
// system prompt longer than one 128-character chunk all go where the first
// went, and /v1/route explains them as "prefix"; so do token-id
// completions sharing a prefix. Before chat had a routing text every chat
// request was "no_match" and spread at random over the 4 engines.
func TestPrefixCharsRoutesChat(t *testing.T) {
	front := newTextServer(t, 4, "prefix_chars")
	client := front.Client()
	post := func(path, body string) (string, []byte) {
		t.Helper()
		resp, err := client.Post(front.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s %v", path, resp.StatusCode, out, err)
		}
		return resp.Header.Get("X-Kvrouter-Replica"), out
	}
	system := strings.Repeat("You are a helpful assistant for the kvrouter docs. ", 6) // 306 characters
	chat := func(q int) string {
		return fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":%q},{"role":"user","content":"question %d"}]}`, system, q)
	}
	first, _ := post("/v1/chat/completions", chat(0))
	for q := 1; q <= 12; q++ {
		if got, _ := post("/v1/chat/completions", chat(q)); got != first {
			t.Fatalf("chat %d went to %s, the shared system prompt to %s", q, got, first)
		}
	}
	_, raw := post("/v1/route", chat(99))
	var ex struct {
		Replica string `json:"replica"`
		Explain struct {
			Reason     string `json:"reason"`
			Candidates []struct {
				Replica string  `json:"replica"`
				Cost    float64 `json:"cost"`
			} `json:"candidates"`
		} `json:"explain"`
	}
	if err := json.Unmarshal(raw, &ex); err != nil {
		t.Fatal(err)
	}
	if ex.Explain.Reason != "prefix" || ex.Replica != first {
		t.Fatalf("route explain: %s", raw)
	}
	for _, c := range ex.Explain.Candidates {
		want := 0.0
		if c.Replica == first {
			want = -256 // two whole 128-character chunks of the 306-character system prompt
		}
		if c.Cost != want {
			t.Fatalf("candidate %s cost %v, want %v: %s", c.Replica, c.Cost, want, raw)
		}
	}

	ids := func(last int) string {
		var sb strings.Builder
		for i := range 100 {
			fmt.Fprintf(&sb, "%d,", 1000+i)
		}
		return fmt.Sprintf(`{"model":"m","prompt":[%s%d]}`, sb.String(), last)
	}
	tokFirst, _ := post("/v1/completions", ids(0))
	for i := 1; i <= 12; i++ {
		if got, _ := post("/v1/completions", ids(i)); got != tokFirst {
			t.Fatalf("token-id prompt %d went to %s, its prefix to %s", i, got, tokFirst)
		}
	}
}

// TestBackendUsesText: only a serving prefix_chars asks for the text.
func TestBackendUsesText(t *testing.T) {
	for _, tc := range []struct {
		policy, serve string
		want          bool
	}{{"prefix_chars", "", true}, {"kv", "", false}, {"round_robin", "", false},
		{config.PolicyShadow, "prefix_chars", true}, {config.PolicyShadow, "", false}} {
		b, err := group.NewBackend(group.BackendConfig{Model: "m", Replicas: []string{"a"}, Policy: tc.policy, ShadowServe: tc.serve}, nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if b.UsesText() != tc.want {
			t.Errorf("%s/%s: UsesText %v", tc.policy, tc.serve, !tc.want)
		}
	}
}
