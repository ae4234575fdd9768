package epp

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Outcome labels of kvrouter_epp_requests_total.
const (
	outcomeOK           = "ok"             // engine answered 2xx, the response went through whole
	outcomeEngineError  = "engine_error"   // engine answered 4xx/5xx, or an error event
	outcomeBadRequest   = "bad_request"    // answered by the picker: 400, 401, 404, 413
	outcomeNoReplica    = "no_replica"     // 503: no ready endpoint (or none in the subset)
	outcomeShed         = "shed"           // 429: every candidate at max_in_flight
	outcomeUpstream     = "upstream_error" // the picker's own failure (500)
	outcomeClientClosed = "client_closed"  // the stream ended before the response did
	outcomeProtocol     = "protocol_error" // a malformed ext_proc sequence
	outcomePassthrough  = "passthrough"    // not an inference request: sent to an endpoint without routing
)

// metrics are the EPP's collectors. They are a set of their own, not the
// HTTP front's kvrouter_proxy_* with a front label: that label would
// change every series of the HTTP front (dashboards, alerts, the metrics
// reference) while other work edits those files; the shared core (index,
// routing, tokenizer, fleet, pool) exports one set for both fronts.
type metrics struct {
	requests     *prometheus.CounterVec
	pick         *prometheus.HistogramVec
	inFlight     *prometheus.GaugeVec
	moved        *prometheus.CounterVec
	usageTokens  *prometheus.CounterVec
	cachedTokens *prometheus.HistogramVec
	streams      prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_epp_requests_total",
			Help: "Requests seen by the endpoint picker by model, replica picked (or served) and outcome (ok, engine_error, bad_request, no_replica, shed, upstream_error, client_closed, protocol_error, passthrough).",
		}, []string{"model", "replica", "outcome"}),
		pick: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvrouter_epp_pick_duration_seconds",
			Help:    "Time from the end of the request body (or headers without a body) to the pick sent to the gateway: parse, tokenize, route.",
			Buckets: []float64{1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, .1, .5},
		}, []string{"model"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvrouter_epp_in_flight_requests",
			Help: "Requests picked onto each replica whose response has not ended.",
		}, []string{"replica"}),
		moved: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_epp_served_elsewhere_total",
			Help: "Requests the gateway reported served by another endpoint than the pick (its retries); their lease moved there.",
		}, []string{"model"}),
		usageTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_epp_usage_tokens_total",
			Help: "Tokens the engines reported in responses' usage, by kind (prompt, completion, cached).",
		}, []string{"model", "kind"}),
		cachedTokens: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvrouter_epp_predicted_cached_tokens",
			Help:    "Prefix-cache hit predicted on the picked replica, in tokens.",
			Buckets: prometheus.ExponentialBuckets(16, 4, 9),
		}, []string{"model"}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvrouter_epp_streams",
			Help: "ext_proc streams open (one per HTTP request through the gateway).",
		}),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.requests, m.pick, m.inFlight, m.moved, m.usageTokens, m.cachedTokens, m.streams} {
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
		m.requests.WithLabelValues(model, "", o)
	}
	m.pick.WithLabelValues(model)
	m.moved.WithLabelValues(model)
	m.cachedTokens.WithLabelValues(model)
	for _, k := range []string{"prompt", "completion", "cached"} {
		m.usageTokens.WithLabelValues(model, k)
	}
}
