package proxy

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the proxy's collectors.
type metrics struct {
	requests           *prometheus.CounterVec
	decision           *prometheus.HistogramVec
	promptTokens       *prometheus.HistogramVec
	cachedTokens       *prometheus.HistogramVec
	ttft               *prometheus.HistogramVec
	itl                *prometheus.HistogramVec
	inFlight           *prometheus.GaugeVec
	retries            *prometheus.CounterVec
	tokenize           *prometheus.HistogramVec
	tokenizeErrors     *prometheus.CounterVec
	tokenizeNoEngine   *prometheus.CounterVec
	shadowDecisions    *prometheus.CounterVec
	shadowCachedTokens *prometheus.HistogramVec
}

// initModel creates one model's series at 0: requests_total for every
// outcome (with no replica: answered before one was chosen; per replica:
// answered by or after it), its histograms, retries by reason, tokenizer
// counters, and in shadow mode the shadow series.
func (m *metrics) initModel(model string, replicas []string, shadow bool) {
	for _, o := range []string{outcomeBadRequest, outcomeNoReplica, outcomeUpstream, outcomeClientClosed, outcomeRouteOnly} {
		m.requests.WithLabelValues(model, "", o)
	}
	for _, r := range replicas {
		m.initReplica(model, r)
	}
	for _, h := range []*prometheus.HistogramVec{m.decision, m.promptTokens, m.cachedTokens, m.ttft, m.itl, m.tokenize} {
		h.WithLabelValues(model)
	}
	for _, reason := range []string{"conn_error", "status_429", "status_502", "status_503"} {
		m.retries.WithLabelValues(model, reason)
	}
	m.tokenizeErrors.WithLabelValues(model)
	m.tokenizeNoEngine.WithLabelValues(model)
	if shadow {
		m.shadowDecisions.WithLabelValues(model, "true")
		m.shadowDecisions.WithLabelValues(model, "false")
		m.shadowCachedTokens.WithLabelValues(model)
	}
}

// initReplica creates one replica's requests_total series at 0.
func (m *metrics) initReplica(model, replica string) {
	for _, o := range []string{outcomeOK, outcomeEngineError, outcomeBadRequest, outcomeUpstream, outcomeTimeout, outcomeClientClosed, outcomeRouteOnly} {
		m.requests.WithLabelValues(model, replica, o)
	}
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	tokens := prometheus.ExponentialBuckets(16, 4, 9) // 16 .. 1M tokens
	latency := []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_proxy_requests_total",
			Help: "Inference requests by model, last replica tried and outcome (ok, engine_error, bad_request, no_replica, upstream_error, timeout, client_closed, route_only).",
		}, []string{"model", "replica", "outcome"}),
		decision: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvrouter_proxy_decision_duration_seconds",
			Help:    "Time the router took to choose a replica (per attempt).",
			Buckets: []float64{1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2},
		}, []string{"model"}),
		promptTokens: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvrouter_proxy_prompt_tokens",
			Help:    "Prompt length in tokens of routed requests whose tokens were known.",
			Buckets: tokens,
		}, []string{"model"}),
		cachedTokens: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvrouter_proxy_predicted_cached_tokens",
			Help:    "Prefix-cache hit predicted on the chosen replica, in tokens (sum over prompt_tokens sum is the predicted hit rate).",
			Buckets: tokens,
		}, []string{"model"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvrouter_proxy_time_to_first_token_seconds",
			Help:    "Streaming requests: time from the request's arrival to the first event relayed.",
			Buckets: latency,
		}, []string{"model"}),
		itl: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvrouter_proxy_inter_token_latency_seconds",
			Help:    "Streaming requests: time between two relayed writes of events.",
			Buckets: []float64{.001, .0025, .005, .01, .02, .04, .08, .16, .32, .64, 1.28, 2.56},
		}, []string{"model"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvrouter_proxy_in_flight_requests",
			Help: "Requests open on each replica.",
		}, []string{"replica"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_proxy_retries_total",
			Help: "Attempts retried on another replica, by reason (conn_error, status_429, status_502, status_503).",
		}, []string{"model", "reason"}),
		tokenize: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvrouter_proxy_tokenize_duration_seconds",
			Help:    "Time to obtain a request's token ids (local tokenizer or engine render).",
			Buckets: []float64{1e-5, 1e-4, 5e-4, 1e-3, 5e-3, .01, .05, .1, .5, 1},
		}, []string{"model"}),
		tokenizeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_proxy_tokenize_errors_total",
			Help: "Requests whose token ids could not be obtained (routed by load).",
		}, []string{"model"}),
		tokenizeNoEngine: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_proxy_tokenizer_unavailable_total",
			Help: "Requests routed by load because no engine of the model could tokenize them (every render engine down or unreachable); also counted in kvrouter_proxy_tokenize_errors_total.",
		}, []string{"model"}),
		shadowDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_proxy_shadow_decisions_total",
			Help: "Shadow mode: requests by whether the shadow policy (kv) chose the replica that served (agree=true|false).",
		}, []string{"model", "agree"}),
		shadowCachedTokens: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvrouter_proxy_shadow_cached_tokens",
			Help:    "Shadow mode: prefix-cache hit in tokens the shadow policy (kv) would have found on its choice.",
			Buckets: tokens,
		}, []string{"model"}),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.requests, m.decision, m.promptTokens, m.cachedTokens, m.ttft, m.itl,
		m.inFlight, m.retries, m.tokenize, m.tokenizeErrors, m.tokenizeNoEngine, m.shadowDecisions, m.shadowCachedTokens} {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return m, nil
}
