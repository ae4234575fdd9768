package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"kvrouter/internal/promtest"
)

const (
	rulesFile     = "../../deploy/prometheus/rules.yaml"
	rulesTestFile = "../../deploy/prometheus/rules_test.yaml"
	dashboardFile = "../../deploy/grafana/kvrouter.json"
)

type ruleGroups struct {
	Groups []struct {
		Rules []struct {
			Record, Alert, Expr string
		}
	}
}

func loadRules(t *testing.T) ruleGroups {
	t.Helper()
	data, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var g ruleGroups
	if err := yaml.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	return g
}

// TestPrometheusRules runs the real promtool: the rules file is valid and
// its unit tests pass, and every alert has a unit test where it fires and
// one where it stays quiet.
func TestPrometheusRules(t *testing.T) {
	promtool := promtest.Tool(t, "promtool")
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", rulesTestFile}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "SUCCESS") {
			t.Fatalf("promtool %v: %v\n%s", args, err, out)
		}
	}
	data, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string
				ExpAlerts []map[string]any `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		}
	}
	if err := yaml.Unmarshal(data, &tests); err != nil {
		t.Fatal(err)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	n := 0
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			if !fires[r.Alert] || !quiet[r.Alert] {
				t.Errorf("alert %s: unit test firing %v, quiet %v; want both", r.Alert, fires[r.Alert], quiet[r.Alert])
			}
		}
	}
	if n < 6 {
		t.Errorf("%d alerts, want the six failure modes at least", n)
	}
}

type dashboard struct {
	Title  string
	Panels []struct {
		ID         int
		Type       string
		Title      string
		Datasource struct{ UID string }
		GridPos    struct{ H, W, X, Y int }
		Targets    []struct{ Expr, RefID string }
	}
	Templating struct {
		List []struct {
			Name       string
			Definition string
		}
	}
}

// dashboardExprs returns the panel titles and expressions of the
// dashboard, with Grafana's variables replaced as Grafana would for "All"
// models, front "http" (so that a query on a series without the front
// label finds nothing) and a 15 s rate interval (four 1 s scrapes and
// more).
func dashboardExprs(t *testing.T) (dashboard, map[string]string) {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	exprs := map[string]string{}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			e := strings.ReplaceAll(tg.Expr, "$__rate_interval", "15s")
			e = strings.ReplaceAll(e, "$model", ".*")
			e = strings.ReplaceAll(e, "$front", "http")
			exprs[p.Title+" / "+tg.RefID] = e
		}
	}
	return d, exprs
}

func TestDashboardShape(t *testing.T) {
	d, exprs := dashboardExprs(t)
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d repeated", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.X+p.GridPos.W > 24 || p.GridPos.W == 0 {
			t.Errorf("panel %q: grid %+v", p.Title, p.GridPos)
		}
		if p.Type != "row" && (p.Datasource.UID != "${datasource}" || len(p.Targets) == 0) {
			t.Errorf("panel %q: datasource %q, %d queries", p.Title, p.Datasource.UID, len(p.Targets))
		}
	}
	for k, e := range exprs {
		for _, removed := range []string{"vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_hit_rate"} {
			if strings.Contains(e, removed+"{") || strings.Contains(e, removed+")") || strings.Contains(e, removed+"[") {
				t.Errorf("%s reads the removed %s", k, removed)
			}
		}
	}
	if len(exprs) < 25 {
		t.Errorf("%d queries", len(exprs))
	}
	// The request series both fronts share (package frontmetrics) are
	// filtered by the front variable wherever they are read.
	front := false
	for _, v := range d.Templating.List {
		front = front || v.Name == "front" && v.Definition == "label_values(kvrouter_proxy_requests_total, front)"
	}
	if !front {
		t.Error("no front variable over kvrouter_proxy_requests_total")
	}
	shared := regexp.MustCompile(`kvrouter_proxy_(requests_total|decision_duration_seconds|prompt_tokens|predicted_cached_tokens|time_to_first_token_seconds|inter_token_latency_seconds|in_flight_requests|tokenize_duration_seconds|tokenize_errors_total|tokenizer_unavailable_total|shadow_decisions_total|shadow_cached_tokens)[a-z_]*(\{[^}]*\})?`)
	n := 0
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			for _, sel := range shared.FindAllString(tg.Expr, -1) {
				n++
				if !strings.Contains(sel, `front=~"$front"`) {
					t.Errorf("panel %q reads %s without the front variable", p.Title, sel)
				}
			}
		}
	}
	if n < 6 {
		t.Errorf("%d selectors of the shared request series", n)
	}
}

// TestDashboardAndRulesLive runs a fleet on loopback (three engine-sim
// processes with KV events and the Qwen3 tokenizer; kvrouter serving model
// m with kv on two of them and model s in shadow mode on the third, with
// the local tokenizer so the mismatch probe runs), drives streaming chats
// with shared prefixes through it, and has a real Prometheus scrape them
// all with the rules loaded. Every dashboard query must return at least one
// sample that is a number, and every recording rule must produce series.
func TestDashboardAndRulesLive(t *testing.T) {
	promtest.Tool(t, "prometheus")
	e2eLeakCheck(t)
	bin := e2eBuild(t)
	a, b, c := opsSim(t, bin, "m"), opsSim(t, bin, "m"), opsSim(t, bin, "s")
	var y strings.Builder
	y.WriteString("health: {probe_interval: 200ms, scrape_interval: 200ms}\nmodels:\n")
	for _, m := range []struct {
		name, policy string
		sims         []*e2eSim
	}{{"m", "kv", []*e2eSim{a, b}}, {"s", "shadow", []*e2eSim{c}}} {
		fmt.Fprintf(&y, "  - name: %s\n    tokenizer: %s\n    policy: %s\n    engines:\n", m.name, e2eQwen3Dir, m.policy)
		for i, s := range m.sims {
			fmt.Fprintf(&y, "      - {name: %s%d, url: %q, events: %q, replay: %q}\n", m.name, i, s.url, s.events, s.replay)
		}
	}
	url, _ := serveLogged(t, y.String())
	r := &e2eRouter{t: t, url: url, client: &http.Client{Timeout: 30 * time.Second}}
	t.Cleanup(r.client.CloseIdleConnections)
	opsWaitReady(t, url)
	t.Cleanup(func() { a.stop(); b.stop(); c.stop() }) // before the router stops (zmq4 close race)

	prom := promtest.Start(t, time.Second, []promtest.Job{
		{Name: "kvrouter", Targets: []string{hostPort(url)}},
		{Name: "vllm", Targets: []string{hostPort(a.url), hostPort(b.url), hostPort(c.url)}},
	}, rulesFile)
	prom.WaitTargetsUp(t, 4, 30*time.Second)

	// Traffic for the whole test: conversations over two system prompts.
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				sys := fmt.Sprintf("You are assistant %d. Answer briefly and precisely, citing sources.", (w+i)%2)
				model := "m"
				if i%3 == 0 {
					model = "s"
				}
				body := strings.Replace(e2eChat(sys, fmt.Sprintf("question %d from worker %d about caching", i%5, w)), `"model":"m"`,
					fmt.Sprintf(`"model":%q,"stream":true`, model), 1)
				if err := opsPost(r, "/v1/chat/completions", body); err != nil && ctx.Err() == nil {
					t.Errorf("request: %v", err)
					return
				}
			}
		}()
	}
	defer func() { stop(); wg.Wait() }()

	_, exprs := dashboardExprs(t)
	for _, g := range loadRules(t).Groups {
		for _, rule := range g.Rules {
			if rule.Record != "" {
				exprs["recording rule "+rule.Record] = rule.Record
			}
		}
	}
	// Recording rules evaluate every second; windows need two scrapes.
	pending := map[string]string{}
	for k, e := range exprs {
		pending[k] = e
	}
	deadline := time.Now().Add(40 * time.Second)
	for len(pending) > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Second)
		for k, e := range pending {
			v, err := prom.Query(context.Background(), e)
			if err != nil {
				t.Fatalf("%s: %v", k, err)
			}
			if len(v) > 0 && !math.IsNaN(v[0].Value) {
				delete(pending, k)
			}
		}
	}
	for k, e := range pending {
		v, _ := prom.Query(context.Background(), e)
		t.Errorf("%s: no numeric data: %s = %v", k, e, v)
	}
	// Alert expressions are valid PromQL against the live metric names.
	for _, g := range loadRules(t).Groups {
		for _, rule := range g.Rules {
			if _, err := prom.Query(context.Background(), rule.Expr); err != nil {
				t.Errorf("rule %s%s: %v", rule.Record, rule.Alert, err)
			}
		}
	}
	// The model variable's query lists both models.
	v, err := prom.Query(context.Background(), "group by (model) (kvrouter_routing_decisions_total)")
	if err != nil || len(v) != 2 {
		t.Errorf("model variable: %v %v", v, err)
	}
	// A number from the fleet: the engines report hits for shared prefixes.
	// The recording rule has a value only once an evaluation (every 1 s)
	// has seen two scrapes with traffic: the dashboard's queries above
	// can have data before that, so poll it too.
	var hr []promtest.Sample
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		hr, err = prom.Query(context.Background(), `model_name:vllm_prefix_cache_hit_rate:ratio_rate5m{model_name="m"}`)
		if err != nil || len(hr) == 1 || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || len(hr) != 1 {
		t.Fatalf("engine hit rate of m: %v %v", hr, err)
	}
	if hr[0].Value <= 0.1 {
		t.Errorf("engine hit rate of m %.3f, want above 10%% (shared system prompts)", hr[0].Value)
	}
	t.Logf("%d queries returned data; engine hit rate of m %.2f", len(exprs)-len(pending), hr[0].Value)
}
