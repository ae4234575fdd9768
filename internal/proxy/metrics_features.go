package proxy

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/config"
)

// featureMetrics are the series of adapters and route aliases.
type featureMetrics struct {
	adapterLoads  *prometheus.CounterVec
	routeRequests *prometheus.CounterVec
	routeTokens   *prometheus.CounterVec
}

func newFeatureMetrics(reg prometheus.Registerer) (*featureMetrics, error) {
	m := &featureMetrics{
		adapterLoads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_proxy_adapter_loads_total",
			Help: "LoRA adapters loaded by kvrouter at run time (POST /v1/load_lora_adapter), by model group, engine and result (ok, error).",
		}, []string{"model", "engine", "result"}),
		routeRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_proxy_route_requests_total",
			Help: "Requests for a route alias, by alias and outcome (as kvrouter_proxy_requests_total).",
		}, []string{"route", "outcome"}),
		routeTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_proxy_route_tokens_total",
			Help: "Tokens of a route alias's answers as the engines reported them in usage, by alias and kind (prompt, cached: prompt_tokens_details.cached_tokens, reasoning: completion_tokens_details.reasoning_tokens).",
		}, []string{"route", "kind"}),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.adapterLoads, m.routeRequests, m.routeTokens} {
		errs = append(errs, reg.Register(c))
	}
	return m, errors.Join(errs...)
}

// initModel creates a group's series at 0: each alias's requests by outcome
// and tokens by kind, each configured adapter's loads per engine (engines
// added later get theirs at their first load).
func (m *featureMetrics) initModel(mc config.Model, engines []string) {
	for _, a := range mc.Aliases {
		for _, o := range []string{outcomeOK, outcomeEngineError, outcomeBadRequest, outcomeNoReplica, outcomeUpstream, outcomeTimeout, outcomeClientClosed, outcomeRouteOnly} {
			m.routeRequests.WithLabelValues(a.Name, o)
		}
		for _, k := range []string{"prompt", "cached", "reasoning"} {
			m.routeTokens.WithLabelValues(a.Name, k)
		}
	}
	if len(mc.Adapters) == 0 {
		return
	}
	for _, e := range engines {
		for _, r := range []string{"ok", "error"} {
			m.adapterLoads.WithLabelValues(mc.Name, e, r)
		}
	}
}
