package epp

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/frontmetrics"
)

// Outcome labels of kvrouter_proxy_requests_total{front="epp"}, from the
// set both fronts share (package frontmetrics).
const (
	outcomeOK           = frontmetrics.OutcomeOK           // engine answered 2xx, the response went through whole
	outcomeEngineError  = frontmetrics.OutcomeEngineError  // engine answered 4xx/5xx, or an error event
	outcomeBadRequest   = frontmetrics.OutcomeBadRequest   // answered by the picker: 400, 401, 404, 413
	outcomeNoReplica    = frontmetrics.OutcomeNoReplica    // 503: no ready endpoint (or none in the subset)
	outcomeShed         = frontmetrics.OutcomeShed         // 429: every candidate at max_in_flight
	outcomeUpstream     = frontmetrics.OutcomeUpstream     // the picker's own failure (500)
	outcomeClientClosed = frontmetrics.OutcomeClientClosed // the stream ended before the response did
	outcomeProtocol     = frontmetrics.OutcomeProtocol     // a malformed ext_proc sequence
	outcomePassthrough  = frontmetrics.OutcomePassthrough  // not an inference request: sent to an endpoint without routing
)

// metrics are the EPP's collectors: its view of the request series both
// fronts share (kvrouter_proxy_*{front="epp"}) and the series only the
// picker has (kvrouter_epp_*).
//
// In shadow mode the shared shadow series
// (kvrouter_proxy_shadow_*{front="epp"}, frontmetrics.Front.ObserveShadow)
// get one observation per request picked, recorded with its prompt tokens
// when the pick is sent to the gateway: the requests whose outcome is
// later ok, engine_error or client_closed (or protocol_error, for a
// malformed sequence after the pick). The gateway's retries on the
// fallbacks and a served endpoint other than the pick add none (the
// comparison stays with the pick), and neither do the requests answered
// without a pick: bad_request, no_replica, shed, upstream_error,
// protocol_error before the pick, and passthrough.
type metrics struct {
	*frontmetrics.Front
	pick        *prometheus.HistogramVec
	moved       *prometheus.CounterVec
	usageTokens *prometheus.CounterVec
	streams     prometheus.Gauge
	bodyHeld    prometheus.Gauge
}

// newMetrics takes the EPP's view of fs and registers the EPP-only
// collectors on reg.
func newMetrics(reg prometheus.Registerer, fs *frontmetrics.Set) (*metrics, error) {
	m := &metrics{
		Front: fs.Front(frontmetrics.EPP),
		pick: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvrouter_epp_pick_duration_seconds",
			Help:    "Time from the end of the request body (or headers without a body) to the pick sent to the gateway: parse, tokenize, route.",
			Buckets: []float64{1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, .1, .5},
		}, []string{"model"}),
		moved: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_epp_served_elsewhere_total",
			Help: "Requests the gateway reported served by another endpoint than the pick (its retries); their lease moved there.",
		}, []string{"model"}),
		usageTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_epp_usage_tokens_total",
			Help: "Tokens the engines reported in responses' usage, by kind (prompt, completion, cached).",
		}, []string{"model", "kind"}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvrouter_epp_streams",
			Help: "ext_proc streams open (one per HTTP request through the gateway).",
		}),
		bodyHeld: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvrouter_epp_body_held_bytes",
			Help: "Bytes of request bodies the streams hold, counted against body_budget (shared with the HTTP front).",
		}),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.pick, m.moved, m.usageTokens, m.streams, m.bodyHeld} {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return m, nil
}

// initModel creates one model's series at 0.
func (m *metrics) initModel(model string) {
	for _, o := range []string{outcomeBadRequest, outcomeNoReplica, outcomeShed, outcomeUpstream, outcomeProtocol} {
		m.Requests.WithLabelValues(model, "", o)
	}
	for _, h := range []prometheus.ObserverVec{m.pick, m.Decision, m.PromptTokens, m.CachedTokens, m.TTFT, m.ITL, m.Tokenize} {
		h.WithLabelValues(model)
	}
	m.TokenizeErrors.WithLabelValues(model)
	m.TokenizerUnavailable.WithLabelValues(model)
	m.moved.WithLabelValues(model)
	for _, k := range []string{"prompt", "completion", "cached"} {
		m.usageTokens.WithLabelValues(model, k)
	}
}
