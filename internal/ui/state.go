package ui

import (
	"sort"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// State is the JSON of GET /ui/state.
type State struct {
	Time   time.Time    `json:"time"`
	Models []ModelState `json:"models"`
	// Recent decisions, newest first.
	Recent []Decision `json:"recent"`
}

// ModelState is one model group.
type ModelState struct {
	Name   string `json:"name"`
	Policy string `json:"policy"`
	Panic  bool   `json:"panic"`
	// IndexEntries is kvrouter_kvindex_entries summed over the group's pools.
	IndexEntries float64 `json:"index_entries"`
	// PredictedHitRate is the router's, cached / prompt tokens routed since
	// start (kvrouter_routing_*_tokens_total); EngineHitRate the engines'
	// hits / queries since their start, in tokens.
	PredictedHitRate *float64 `json:"predicted_hit_rate"`
	EngineHitRate    *float64 `json:"engine_hit_rate"`
	// Decisions counts kvrouter_routing_decisions_total by policy, replica.
	Decisions map[string]map[string]float64 `json:"decisions"`
	Engines   []EngineState                 `json:"engines"`
}

// EngineState is one engine of a model group.
type EngineState struct {
	Name         string `json:"name"`
	URL          string `json:"url"`
	Up           bool   `json:"up"`
	Probed       bool   `json:"probed"`
	Admitted     bool   `json:"admitted"`
	Panic        bool   `json:"panic"`
	ModelMissing bool   `json:"model_missing"`
	// Events is "connected" (every rank), "disconnected" or "none" (no
	// event stream configured).
	Events string `json:"events"`
	// LagSeconds is the mean KV event lag since start (nil: no events yet).
	LagSeconds *float64 `json:"lag_seconds"`
	// InFlight and QueuedPrefillTokens are the router's counts.
	InFlight            float64 `json:"in_flight"`
	QueuedPrefillTokens float64 `json:"queued_prefill_tokens"`
	// From the engine's last scraped /metrics (nil before a scrape).
	Running       *float64   `json:"running"`
	Waiting       *float64   `json:"waiting"`
	KVUsage       *float64   `json:"kv_usage"`
	EngineHitRate *float64   `json:"engine_hit_rate"`
	ScrapedAt     *time.Time `json:"scraped_at,omitempty"`
}

// State assembles the snapshot now.
func (u *UI) State() State {
	st := State{Time: u.deps.Now(), Recent: u.recentDecisions()}
	g := gather(u)
	u.mu.Lock()
	engines := make(map[string]engineSample, len(u.engines))
	for k, v := range u.engines {
		engines[k] = v
	}
	u.mu.Unlock()
	for _, model := range u.deps.Fleet.Models() {
		ms := ModelState{Name: model, Policy: u.cfg.Policies[model], Panic: u.deps.Fleet.Panic(model),
			IndexEntries: g.sum("kvrouter_kvindex_entries", "model", model), Decisions: map[string]map[string]float64{}}
		if p := g.sum("kvrouter_routing_prompt_tokens_total", "model", model); p > 0 {
			v := g.sum("kvrouter_routing_cached_tokens_total", "model", model) / p
			ms.PredictedHitRate = &v
		}
		for _, s := range g.samples("kvrouter_routing_decisions_total") {
			if s.labels["model"] != model {
				continue
			}
			pol := s.labels["policy"]
			if ms.Decisions[pol] == nil {
				ms.Decisions[pol] = map[string]float64{}
			}
			ms.Decisions[pol][s.labels["replica"]] += s.value
		}
		var hits, queries float64
		for _, es := range u.deps.Fleet.States(model) {
			e := EngineState{Name: es.Name, Up: es.Up, Probed: es.Probed, Admitted: es.Admitted, Panic: es.Panic, ModelMissing: es.ModelMissing,
				InFlight:            g.sum("kvrouter_routing_in_flight_requests", "replica", es.Name),
				QueuedPrefillTokens: g.sum("kvrouter_routing_queued_prefill_tokens", "replica", es.Name)}
			if ep := u.deps.Fleet.Endpoint(es.Name); ep != nil {
				e.URL = ep.URL()
			}
			e.Events = "none"
			if ranks := g.match("kvrouter_vllm_connected", "engine", es.Name); len(ranks) > 0 {
				e.Events = "connected"
				for _, r := range ranks {
					if r.value != 1 {
						e.Events = "disconnected"
					}
				}
			}
			if sum, n := g.histogram("kvrouter_vllm_lag_seconds", "engine", es.Name); n > 0 {
				v := sum / n
				e.LagSeconds = &v
			}
			if s, ok := engines[es.Name]; ok {
				m, at := s.m, s.at
				e.Running, e.Waiting, e.KVUsage, e.ScrapedAt = &m.Running, &m.Waiting, &m.KVCacheUsage, &at
				if m.PrefixCacheQueries > 0 {
					v := m.PrefixCacheHits / m.PrefixCacheQueries
					e.EngineHitRate = &v
				}
				hits, queries = hits+m.PrefixCacheHits, queries+m.PrefixCacheQueries
			}
			ms.Engines = append(ms.Engines, e)
		}
		sort.Slice(ms.Engines, func(i, j int) bool { return ms.Engines[i].Name < ms.Engines[j].Name })
		if queries > 0 {
			v := hits / queries
			ms.EngineHitRate = &v
		}
		st.Models = append(st.Models, ms)
	}
	return st
}

// gathered is one Gather of the router's registry.
type gathered map[string][]sample

type sample struct {
	labels     map[string]string
	value      float64
	sum, count float64 // histograms
}

func gather(u *UI) gathered {
	g := gathered{}
	if u.deps.Gatherer == nil {
		return g
	}
	fams, _ := u.deps.Gatherer.Gather() // a partial gather still helps the page
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			s := sample{labels: map[string]string{}}
			for _, l := range m.GetLabel() {
				s.labels[l.GetName()] = l.GetValue()
			}
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				s.value = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				s.value = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				s.sum, s.count = m.GetHistogram().GetSampleSum(), float64(m.GetHistogram().GetSampleCount())
			default:
				s.value = m.GetUntyped().GetValue()
			}
			g[f.GetName()] = append(g[f.GetName()], s)
		}
	}
	return g
}

func (g gathered) samples(name string) []sample { return g[name] }

func (g gathered) match(name, label, value string) []sample {
	var out []sample
	for _, s := range g[name] {
		if s.labels[label] == value {
			out = append(out, s)
		}
	}
	return out
}

func (g gathered) sum(name, label, value string) float64 {
	var t float64
	for _, s := range g.match(name, label, value) {
		t += s.value
	}
	return t
}

func (g gathered) histogram(name, label, value string) (sum, count float64) {
	for _, s := range g.match(name, label, value) {
		sum, count = sum+s.sum, count+s.count
	}
	return sum, count
}
