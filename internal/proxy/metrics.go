package proxy

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/frontmetrics"
)

// metrics are the proxy's collectors: the request series shared with the
// endpoint picker (package frontmetrics, front="http") and the HTTP
// front's own.
type metrics struct {
	front            *frontmetrics.Set   // shared with the EPP (Picker.FrontMetrics)
	view             *frontmetrics.Front // front="http"
	requests         *prometheus.CounterVec
	decision         prometheus.ObserverVec
	promptTokens     prometheus.ObserverVec
	cachedTokens     prometheus.ObserverVec
	ttft             prometheus.ObserverVec
	itl              prometheus.ObserverVec
	inFlight         *prometheus.GaugeVec
	retries          *prometheus.CounterVec
	tokenize         prometheus.ObserverVec
	tokenizeErrors   *prometheus.CounterVec
	tokenizeNoEngine *prometheus.CounterVec
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
	for _, h := range []prometheus.ObserverVec{m.decision, m.promptTokens, m.cachedTokens, m.ttft, m.itl, m.tokenize} {
		h.WithLabelValues(model)
	}
	for _, reason := range []string{"conn_error", "status_429", "status_502", "status_503"} {
		m.retries.WithLabelValues(model, reason)
	}
	m.tokenizeErrors.WithLabelValues(model)
	m.tokenizeNoEngine.WithLabelValues(model)
	if shadow {
		m.view.InitShadow(model)
	}
}

// initReplica creates one replica's requests_total series at 0.
func (m *metrics) initReplica(model, replica string) {
	for _, o := range []string{outcomeOK, outcomeEngineError, outcomeBadRequest, outcomeUpstream, outcomeTimeout, outcomeClientClosed, outcomeRouteOnly} {
		m.requests.WithLabelValues(model, replica, o)
	}
}

// newMetrics registers the request metrics set both fronts share
// (Picker.FrontMetrics hands it to the endpoint picker) and the HTTP
// front's own collectors on reg.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	fs, err := frontmetrics.New(reg)
	if err != nil {
		return nil, err
	}
	f := fs.Front(frontmetrics.HTTP)
	m := &metrics{
		front: fs, view: f, requests: f.Requests, decision: f.Decision, promptTokens: f.PromptTokens,
		cachedTokens: f.CachedTokens, ttft: f.TTFT, itl: f.ITL, inFlight: f.InFlight,
		tokenize: f.Tokenize, tokenizeErrors: f.TokenizeErrors, tokenizeNoEngine: f.TokenizerUnavailable,
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_proxy_retries_total",
			Help: "Attempts retried on another replica, by reason (conn_error, status_429, status_502, status_503).",
		}, []string{"model", "reason"}),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.retries} {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return m, nil
}
