package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// PromConfig configures an audit from a Prometheus HTTP API.
type PromConfig struct {
	// URL is the API's base, e.g. http://prometheus:9090. Required.
	URL string
	// Window is the range the counters' increase is taken over (1h).
	Window time.Duration
	// Selector is extra label matchers for the vLLM series, e.g.
	// `job="vllm"` ("" for none).
	Selector string
	// Client is the HTTP client (http.DefaultClient).
	Client *http.Client
	// Now is the query's evaluation time (time.Now).
	Now func() time.Time
}

// FromPrometheus audits the fleet as a Prometheus server saw it over
// cfg.Window. Replicas are the instance label, models the model_name label
// of vLLM's series; kvrouter's shadow series, when present, add what kv
// would have found. It fails on an unreachable API or a query error.
func FromPrometheus(ctx context.Context, cfg PromConfig) (Report, error) {
	if cfg.URL == "" {
		return Report{}, errors.New("no Prometheus URL")
	}
	if cfg.Window <= 0 {
		cfg.Window = time.Hour
	}
	if cfg.Client == nil {
		cfg.Client = http.DefaultClient
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	p := promAPI{cfg: cfg, at: cfg.Now()}
	w := promDuration(cfg.Window)
	sel := ""
	if cfg.Selector != "" {
		sel = "{" + cfg.Selector + "}"
	}
	by := "sum by (model_name, instance) "
	inc := func(names ...string) string {
		var parts []string
		for _, n := range names {
			parts = append(parts, by+"(increase("+n+sel+"["+w+"]))")
		}
		return strings.Join(parts, " or ")
	}
	data := map[string]map[string]Counters{}
	type field struct {
		expr string
		set  func(c *Counters, v float64)
	}
	fields := []field{
		{inc("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"), func(c *Counters, v float64) { c.Queries = v }},
		{inc("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"), func(c *Counters, v float64) { c.Hits = v }},
		{inc("vllm:num_preemptions_total"), func(c *Counters, v float64) { c.Preemptions = v }},
		{inc("vllm:request_success_total"), func(c *Counters, v float64) { c.Requests = v }},
		{inc("vllm:prompt_tokens_total"), func(c *Counters, v float64) { c.PromptTokens = v }},
		{inc("vllm:external_prefix_cache_queries_total"), func(c *Counters, v float64) { c.ExtQueries, c.HasExternal = v, true }},
		{inc("vllm:external_prefix_cache_hits_total"), func(c *Counters, v float64) { c.ExtHits = v }},
		{"avg by (model_name, instance) (avg_over_time(vllm:kv_cache_usage_perc" + sel + "[" + w + "]))" +
			" or avg by (model_name, instance) (avg_over_time(vllm:gpu_cache_usage_perc" + sel + "[" + w + "]))",
			func(c *Counters, v float64) { c.KVUsage, c.HasKVUsage = v, true }},
	}
	for i, f := range fields {
		vec, err := p.query(ctx, f.expr)
		if err != nil {
			return Report{}, err
		}
		for _, s := range vec {
			m, inst := s.Metric["model_name"], s.Metric["instance"]
			if i > 0 && data[m] == nil {
				continue // only replicas that report prefix cache queries
			}
			if data[m] == nil {
				data[m] = map[string]Counters{}
			}
			c := data[m][inst]
			f.set(&c, s.Value)
			data[m][inst] = c
		}
	}
	shadow := map[string]Shadow{}
	for _, q := range []struct {
		expr string
		set  func(s *Shadow, v float64)
	}{
		{"sum by (model) (increase(kvrouter_proxy_shadow_cached_tokens_sum[" + w + "]))", func(s *Shadow, v float64) { s.CachedTokens = v }},
		// The denominator is the prompt tokens of the fronts that record
		// shadow decisions (frontmetrics shadow.go: both, in shadow mode),
		// matched series by series (kvrouter instance, front, model). A
		// kvrouter from before the shadow series had a front label
		// recorded them on the HTTP front alone, and one from before the
		// front label had the HTTP front alone: front="" reads as "http"
		// on both sides.
		{"sum by (model) (label_replace(increase(kvrouter_proxy_prompt_tokens_sum[" + w + "]), \"front\", \"http\", \"front\", \"\")" +
			" and label_replace(kvrouter_proxy_shadow_cached_tokens_count, \"front\", \"http\", \"front\", \"\"))",
			func(s *Shadow, v float64) { s.PromptTokens = v }},
	} {
		vec, err := p.query(ctx, q.expr)
		if err != nil {
			return Report{}, err
		}
		for _, s := range vec {
			sh := shadow[s.Metric["model"]]
			q.set(&sh, s.Value)
			shadow[s.Metric["model"]] = sh
		}
	}
	r := build("prometheus "+cfg.URL, cfg.Window, data, shadow)
	for _, old := range []string{"vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_hit_rate"} {
		vec, err := p.query(ctx, "count("+old+sel+")")
		if err != nil {
			return Report{}, err
		}
		if len(vec) > 0 && vec[0].Value > 0 {
			r.Warnings = append(r.Warnings, removedWarning(old))
		}
	}
	return r, nil
}

// removedWarning is the note for a series vLLM has removed.
func removedWarning(name string) string {
	switch name {
	case "vllm:gpu_cache_usage_perc":
		return "engines still expose vllm:gpu_cache_usage_perc, removed in current vLLM: dashboards reading it go blank after an upgrade; read vllm:kv_cache_usage_perc"
	}
	return "engines still expose vllm:gpu_prefix_cache_hit_rate, removed in current vLLM: dashboards reading it go blank after an upgrade; compute rate(vllm:prefix_cache_hits_total) / rate(vllm:prefix_cache_queries_total)"
}

// promDuration prints d as a PromQL duration in whole seconds (at least 1s).
func promDuration(d time.Duration) string {
	s := int64(d / time.Second)
	if s < 1 {
		s = 1
	}
	return strconv.FormatInt(s, 10) + "s"
}

type promAPI struct {
	cfg PromConfig
	at  time.Time
}

type sample struct {
	Metric map[string]string
	Value  float64
}

// query evaluates an instant vector query at p.at.
func (p promAPI) query(ctx context.Context, expr string) ([]sample, error) {
	form := url.Values{"query": {expr}, "time": {strconv.FormatFloat(float64(p.at.UnixMilli())/1000, 'f', 3, 64)}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(p.cfg.URL, "/")+"/api/v1/query", strings.NewReader(form.Encode()))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := p.cfg.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("prometheus query: %w", err)
	}
	defer resp.Body.Close()
	var body struct {
		Status    string `json:"status"`
		ErrorType string `json:"errorType"`
		Error     string `json:"error"`
		Data      struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("prometheus query %q: HTTP %d, not the API's JSON: %w", expr, resp.StatusCode, err)
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("prometheus query %q: %s: %s", expr, body.ErrorType, body.Error)
	}
	if body.Data.ResultType != "vector" {
		return nil, fmt.Errorf("prometheus query %q: result type %q, want vector", expr, body.Data.ResultType)
	}
	out := make([]sample, 0, len(body.Data.Result))
	for _, r := range body.Data.Result {
		str, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(str, 64)
		if err != nil {
			return nil, fmt.Errorf("prometheus query %q: value %v: %w", expr, r.Value[1], err)
		}
		out = append(out, sample{r.Metric, v})
	}
	return out, nil
}
