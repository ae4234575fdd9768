package audit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// SampleConfig configures an audit that scrapes the engines itself.
type SampleConfig struct {
	// Engines are the engines' base URLs (http://host:8000). Required.
	Engines []string
	// Window is how long to watch (1m); Samples how many scrapes spread
	// over it, at least 2 (6): counters are the last minus the first, KV
	// usage the mean.
	Window  time.Duration
	Samples int
	// Client is the HTTP client (one with a 10 s timeout).
	Client *http.Client
	// Sleep waits between samples (a timer honouring ctx); tests inject
	// their own.
	Sleep func(ctx context.Context, d time.Duration) error
}

// FromEngines audits the engines by scraping their /metrics Samples times
// over Window. Each engine is a replica, named by its URL, of the model its
// series' model_name label names. A counter that goes down (an engine
// restart) counts from zero. It fails when an engine cannot be scraped.
func FromEngines(ctx context.Context, cfg SampleConfig) (Report, error) {
	if len(cfg.Engines) == 0 {
		return Report{}, errors.New("no engines to sample")
	}
	if cfg.Window <= 0 {
		cfg.Window = time.Minute
	}
	if cfg.Samples < 2 {
		cfg.Samples = 6
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: 10 * time.Second}
	}
	if cfg.Sleep == nil {
		cfg.Sleep = sleep
	}
	type state struct {
		last      scrape
		usageSum  float64
		usageN    int
		firstSeen bool
		delta     scrape
	}
	st := make([]state, len(cfg.Engines))
	old := map[string]bool{}
	start := time.Now()
	for i := range cfg.Samples {
		if i > 0 {
			if err := cfg.Sleep(ctx, cfg.Window/time.Duration(cfg.Samples-1)); err != nil {
				return Report{}, err
			}
		}
		for j, u := range cfg.Engines {
			s, err := scrapeEngine(ctx, cfg.Client, u)
			if err != nil {
				return Report{}, err
			}
			e := &st[j]
			if !e.firstSeen {
				e.firstSeen = true
			} else {
				e.delta.add(s.since(e.last))
			}
			e.last = s
			if s.hasUsage {
				e.usageSum += s.usage
				e.usageN++
			}
			for n := range s.old {
				old[n] = true
			}
		}
	}
	window := time.Since(start)
	data := map[string]map[string]Counters{}
	for j, u := range cfg.Engines {
		e := st[j]
		m := e.last.model
		if data[m] == nil {
			data[m] = map[string]Counters{}
		}
		c := e.delta.c
		if e.usageN > 0 {
			c.KVUsage, c.HasKVUsage = e.usageSum/float64(e.usageN), true
		}
		c.HasExternal = e.last.c.HasExternal
		data[m][u] = c
	}
	r := build(fmt.Sprintf("%d engines' /metrics", len(cfg.Engines)), window, data, nil)
	for _, n := range []string{"vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_hit_rate"} {
		if old[n] {
			r.Warnings = append(r.Warnings, removedWarning(n))
		}
	}
	return r, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// scrape is one engine's counters at one time.
type scrape struct {
	model    string
	c        Counters
	usage    float64
	hasUsage bool
	old      map[string]bool
}

// since returns the counter increases from prev to s; a counter lower
// than before restarted and counts from zero.
func (s scrape) since(prev scrape) scrape {
	d := func(now, before float64) float64 {
		if now < before {
			return now
		}
		return now - before
	}
	return scrape{c: Counters{
		Queries: d(s.c.Queries, prev.c.Queries), Hits: d(s.c.Hits, prev.c.Hits),
		Preemptions: d(s.c.Preemptions, prev.c.Preemptions), Requests: d(s.c.Requests, prev.c.Requests),
		PromptTokens: d(s.c.PromptTokens, prev.c.PromptTokens),
		ExtQueries:   d(s.c.ExtQueries, prev.c.ExtQueries), ExtHits: d(s.c.ExtHits, prev.c.ExtHits),
	}}
}

func (s *scrape) add(o scrape) {
	s.c.Queries += o.c.Queries
	s.c.Hits += o.c.Hits
	s.c.Preemptions += o.c.Preemptions
	s.c.Requests += o.c.Requests
	s.c.PromptTokens += o.c.PromptTokens
	s.c.ExtQueries += o.c.ExtQueries
	s.c.ExtHits += o.c.ExtHits
}

// scrapeEngine reads one engine's /metrics.
func scrapeEngine(ctx context.Context, client *http.Client, base string) (scrape, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+"/metrics", nil)
	if err != nil {
		return scrape{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return scrape{}, fmt.Errorf("scrape %s: %w", base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return scrape{}, fmt.Errorf("scrape %s/metrics: HTTP %d", base, resp.StatusCode)
	}
	s, err := parseMetrics(resp.Body)
	if err != nil {
		return scrape{}, fmt.Errorf("scrape %s: %w", base, err)
	}
	return s, nil
}

// parseMetrics reads the vLLM series audit uses from a text exposition
// (current names, then the gpu_ names of older engines).
func parseMetrics(r io.Reader) (scrape, error) {
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return scrape{}, fmt.Errorf("parse metrics: %w", err)
	}
	s := scrape{old: map[string]bool{}}
	sum := func(names ...string) (float64, bool) {
		for _, n := range names {
			f := fams[n]
			if f == nil || len(f.GetMetric()) == 0 {
				continue
			}
			var t float64
			for _, m := range f.GetMetric() {
				t += value(m)
				for _, l := range m.GetLabel() {
					if l.GetName() == "model_name" && s.model == "" {
						s.model = l.GetValue()
					}
				}
			}
			return t, true
		}
		return 0, false
	}
	var ok bool
	if s.c.Queries, ok = sum("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"); !ok {
		return scrape{}, errors.New("no vllm:prefix_cache_queries_total: not a vLLM engine, or prefix caching is off")
	}
	s.c.Hits, _ = sum("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
	s.c.Preemptions, _ = sum("vllm:num_preemptions_total")
	s.c.Requests, _ = sum("vllm:request_success_total")
	s.c.PromptTokens, _ = sum("vllm:prompt_tokens_total")
	s.c.ExtQueries, s.c.HasExternal = sum("vllm:external_prefix_cache_queries_total")
	s.c.ExtHits, _ = sum("vllm:external_prefix_cache_hits_total")
	if f := fams["vllm:kv_cache_usage_perc"]; f != nil && len(f.GetMetric()) > 0 {
		t, _ := sum("vllm:kv_cache_usage_perc")
		s.usage, s.hasUsage = t/float64(len(f.GetMetric())), true
	} else if f := fams["vllm:gpu_cache_usage_perc"]; f != nil && len(f.GetMetric()) > 0 {
		t, _ := sum("vllm:gpu_cache_usage_perc")
		s.usage, s.hasUsage = t/float64(len(f.GetMetric())), true
	}
	for _, n := range []string{"vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_hit_rate"} {
		if fams[n] != nil {
			s.old[n] = true
		}
	}
	return s, nil
}

func value(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}
