// Package frontmetrics holds the request metrics both of kvrouter's fronts
// export from one definition: the HTTP proxy (kvrouter serve, package
// proxy) and the Gateway API Inference Extension endpoint picker (kvrouter
// epp, package epp). The series keep the HTTP front's names
// (kvrouter_proxy_*) and carry a front label, "http" or "epp" (the
// tokenizer's series too: both fronts tokenize with the same code); a process
// running both fronts (kvrouter epp also serves the OpenAI API) registers
// one Set and hands each front its view. Series that only one front can
// measure stay in that front's package.
package frontmetrics

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Values of the front label.
const (
	HTTP = "http" // kvrouter serve's HTTP proxy
	EPP  = "epp"  // kvrouter epp's ext_proc endpoint picker
)

// Outcomes of kvrouter_proxy_requests_total, one set for both fronts.
// Every value but shed, protocol_error and passthrough (EPP only) and
// timeout and route_only (HTTP only) is produced by both.
const (
	OutcomeOK           = "ok"             // the engine answered 2xx (3xx on HTTP) and the response went through whole
	OutcomeEngineError  = "engine_error"   // the engine answered 4xx/5xx, or an error event in its 200 stream
	OutcomeBadRequest   = "bad_request"    // answered by kvrouter: 400, 401, 404, 413
	OutcomeNoReplica    = "no_replica"     // 503: no healthy replica (EPP: or none in the gateway's subset)
	OutcomeShed         = "shed"           // EPP, 429: every candidate at --max-in-flight
	OutcomeUpstream     = "upstream_error" // HTTP: connect failed or the engine broke the response (502); EPP: the picker's own failure (500)
	OutcomeTimeout      = "timeout"        // HTTP: first-byte or idle timeout
	OutcomeClientClosed = "client_closed"  // the client (EPP: the gateway's stream) left before the response ended
	OutcomeRouteOnly    = "route_only"     // HTTP: the decision explained (x-kvrouter-route-only, /v1/route), not forwarded
	OutcomeProtocol     = "protocol_error" // EPP: a malformed ext_proc sequence (500)
	OutcomePassthrough  = "passthrough"    // EPP: not an inference request, sent to an endpoint without routing
)

// Outcomes returns every outcome value, in the order above.
func Outcomes() []string {
	return []string{OutcomeOK, OutcomeEngineError, OutcomeBadRequest, OutcomeNoReplica, OutcomeShed, OutcomeUpstream,
		OutcomeTimeout, OutcomeClientClosed, OutcomeRouteOnly, OutcomeProtocol, OutcomePassthrough}
}

// Set is the shared collectors, registered once per registry.
type Set struct {
	requests     *prometheus.CounterVec
	decision     *prometheus.HistogramVec
	promptTokens *prometheus.HistogramVec
	cachedTokens *prometheus.HistogramVec
	ttft         *prometheus.HistogramVec
	itl          *prometheus.HistogramVec
	inFlight     *prometheus.GaugeVec
	tokenize     *prometheus.HistogramVec
	tokErrors    *prometheus.CounterVec
	tokNoEngine  *prometheus.CounterVec
	shadow       *prometheus.CounterVec   // shadow.go
	shadowCached *prometheus.HistogramVec // shadow.go
}

// New builds the Set and registers it on reg (nil: not registered). The
// error joins every registration failure (a second Set on one registry
// fails: hand the first one to both fronts).
func New(reg prometheus.Registerer) (*Set, error) {
	tokens := prometheus.ExponentialBuckets(16, 4, 9) // 16 .. 1M tokens
	latency := []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
	s := &Set{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_proxy_requests_total",
			Help: "Inference requests by front (http, epp), model, replica (the last tried, or the one that served) and outcome (ok, engine_error, bad_request, no_replica, shed, upstream_error, timeout, client_closed, route_only, protocol_error, passthrough).",
		}, []string{"front", "model", "replica", "outcome"}),
		decision: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvrouter_proxy_decision_duration_seconds",
			Help:    "Time the router took to choose a replica (its Route call per attempt or pick; parsing and tokenizing excluded), by front.",
			Buckets: []float64{1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2},
		}, []string{"front", "model"}),
		promptTokens: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvrouter_proxy_prompt_tokens",
			Help:    "Prompt length in tokens of routed requests whose tokens were known, by front.",
			Buckets: tokens,
		}, []string{"front", "model"}),
		cachedTokens: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvrouter_proxy_predicted_cached_tokens",
			Help:    "Prefix-cache hit predicted on the chosen replica, in tokens, by front (sum over prompt_tokens sum is the predicted hit rate).",
			Buckets: tokens,
		}, []string{"front", "model"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvrouter_proxy_time_to_first_token_seconds",
			Help:    "Streaming requests: time from the request's arrival to the first event relayed (http) or handed to the picker by the gateway (epp).",
			Buckets: latency,
		}, []string{"front", "model"}),
		itl: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvrouter_proxy_inter_token_latency_seconds",
			Help:    "Streaming requests: time between two relayed writes (http) or gateway chunks (epp) carrying events.",
			Buckets: []float64{.001, .0025, .005, .01, .02, .04, .08, .16, .32, .64, 1.28, 2.56},
		}, []string{"front", "model"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvrouter_proxy_in_flight_requests",
			Help: "Requests open on each replica, by front.",
		}, []string{"front", "replica"}),
		tokenize: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvrouter_proxy_tokenize_duration_seconds",
			Help:    "Time to obtain a request's token ids (local tokenizer or engine render), by front.",
			Buckets: []float64{1e-5, 1e-4, 5e-4, 1e-3, 5e-3, .01, .05, .1, .5, 1},
		}, []string{"front", "model"}),
		tokErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_proxy_tokenize_errors_total",
			Help: "Requests whose token ids could not be obtained (routed by load), by front.",
		}, []string{"front", "model"}),
		tokNoEngine: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_proxy_tokenizer_unavailable_total",
			Help: "Requests routed by load because no engine of the model could tokenize them (every render engine down or unreachable), by front; also counted in kvrouter_proxy_tokenize_errors_total.",
		}, []string{"front", "model"}),
	}
	s.shadow, s.shadowCached = newShadow(tokens)
	if reg == nil {
		return s, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{s.requests, s.decision, s.promptTokens, s.cachedTokens, s.ttft, s.itl, s.inFlight, s.tokenize, s.tokErrors, s.tokNoEngine, s.shadow, s.shadowCached} {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return s, nil
}

// Front is one front's view of a Set: each vector with the front label
// fixed, so that its label values are the rest, in the order given.
type Front struct {
	// Requests is kvrouter_proxy_requests_total: model, replica, outcome.
	Requests *prometheus.CounterVec
	// Decision, PromptTokens, CachedTokens, TTFT and ITL are the
	// histograms, by model.
	Decision, PromptTokens, CachedTokens, TTFT, ITL prometheus.ObserverVec
	// InFlight is kvrouter_proxy_in_flight_requests: replica.
	InFlight *prometheus.GaugeVec
	// Tokenize is kvrouter_proxy_tokenize_duration_seconds, and
	// TokenizeErrors and TokenizerUnavailable the counters
	// kvrouter_proxy_tokenize_errors_total and
	// kvrouter_proxy_tokenizer_unavailable_total: by model.
	Tokenize                             prometheus.ObserverVec
	TokenizeErrors, TokenizerUnavailable *prometheus.CounterVec

	set  *Set
	name string
}

// Front returns the view of the front named name (HTTP or EPP).
func (s *Set) Front(name string) *Front {
	l := prometheus.Labels{"front": name}
	// MustCurryWith panics only for a label the vector lacks; every
	// vector here has "front".
	return &Front{
		Requests:             s.requests.MustCurryWith(l),
		Decision:             s.decision.MustCurryWith(l),
		PromptTokens:         s.promptTokens.MustCurryWith(l),
		CachedTokens:         s.cachedTokens.MustCurryWith(l),
		TTFT:                 s.ttft.MustCurryWith(l),
		ITL:                  s.itl.MustCurryWith(l),
		InFlight:             s.inFlight.MustCurryWith(l),
		Tokenize:             s.tokenize.MustCurryWith(l),
		TokenizeErrors:       s.tokErrors.MustCurryWith(l),
		TokenizerUnavailable: s.tokNoEngine.MustCurryWith(l),
		set:                  s,
		name:                 name,
	}
}

// DeleteReplica deletes this front's series of replica (requests by every
// model and outcome, in flight); the other front's stay. (A curried
// vector's DeletePartialMatch matches across every front.)
func (f *Front) DeleteReplica(replica string) {
	f.set.requests.DeletePartialMatch(prometheus.Labels{"front": f.name, "replica": replica})
	f.set.inFlight.DeleteLabelValues(f.name, replica)
}
