package frontmetrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Shadow mode's series (policy: shadow: a model served by another policy
// while the kv policy is evaluated beside it), by front like the other
// shared series, so that the audit can divide a front's shadow cached
// tokens by that front's prompt tokens:
//
//   - kvrouter_proxy_shadow_decisions_total{front, model, agree}: routing
//     decisions by whether kv chose the replica the serving policy chose
//     (agree="true"|"false");
//   - kvrouter_proxy_shadow_cached_tokens{front, model}: the prefix-cache
//     hit in tokens kv would have found on its choice (whole blocks, at
//     most the prompt's length less one token, as vLLM reports it).
//
// Both record one observation per routing decision of the front, the
// decisions kvrouter_proxy_prompt_tokens counts the prompt of (a prompt
// whose tokens are unknown records 0 cached tokens there and is not in
// prompt_tokens), so that shadow_cached_tokens_sum over prompt_tokens_sum
// is the prefix cache hit rate kv would have had on that front's traffic.
// Which decisions record one is the front's to say: the HTTP front
// (package proxy) each attempt it forwards, a retry on another replica
// included; the endpoint picker (package epp) each request it answers with
// a destination, once, whatever its response later does.
func newShadow(tokens []float64) (*prometheus.CounterVec, *prometheus.HistogramVec) {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_proxy_shadow_decisions_total",
			Help: "Shadow mode: routing decisions by front (http, epp) and whether the shadow policy (kv) chose the replica the serving policy chose (agree=true|false).",
		}, []string{"front", "model", "agree"}),
		prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvrouter_proxy_shadow_cached_tokens",
			Help:    "Shadow mode: prefix-cache hit in tokens the shadow policy (kv) would have found on its choice, by front.",
			Buckets: tokens,
		}, []string{"front", "model"})
}

// InitShadow creates model's shadow series of this front at 0 (agree true
// and false, the cached tokens histogram): call it for each model in
// shadow mode, so that dashboards and alerts see 0 before the first
// request.
func (f *Front) InitShadow(model string) {
	f.set.shadow.WithLabelValues(f.name, model, "true")
	f.set.shadow.WithLabelValues(f.name, model, "false")
	f.set.shadowCached.WithLabelValues(f.name, model)
}

// ObserveShadow records one shadow decision of model on this front: agree
// when kv chose the replica the serving policy chose, cachedTokens what kv
// would have found cached there, in tokens.
func (f *Front) ObserveShadow(model string, agree bool, cachedTokens int) {
	f.set.shadow.WithLabelValues(f.name, model, strconv.FormatBool(agree)).Inc()
	f.set.shadowCached.WithLabelValues(f.name, model).Observe(float64(cachedTokens))
}
