package proxy

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"kvrouter/internal/admission"
	"kvrouter/internal/bodybudget"
	"kvrouter/internal/config"
	"kvrouter/internal/fleet"
	"kvrouter/internal/frontmetrics"
	"kvrouter/internal/group"
	"kvrouter/internal/request"
	"kvrouter/internal/tracing"
)

// Deps are a Server's collaborators.
type Deps struct {
	// Fleet holds the engines of every configured model. Required.
	Fleet *fleet.Fleet
	// Routers choose replicas, one per model name. Required for every model.
	Routers map[string]group.Router
	// Tokenizers turn requests into token ids, per model name; a missing or
	// nil entry means tokenizer "none".
	Tokenizers map[string]group.Tokenizer
	// EventsConnected, when not nil, returns the engines (by name) that
	// have a KV event subscriber, true for those whose stream is connected
	// now (every rank), false for the others; GET /ready calls it once per
	// request. Nil: no engine counts as connected.
	EventsConnected func() map[string]bool
	// EngineTLS verifies https:// engines (its RootCAs); nil: the system's
	// roots.
	EngineTLS *tls.Config
	// Gatherer serves GET /metrics; nil: 404.
	Gatherer prometheus.Gatherer
	// UI, when not nil, serves GET /ui and GET /ui/state (the fleet page
	// and its JSON; it does its own authentication).
	UI http.Handler
	// OnDecision, when not nil, is called with every routing decision
	// (forwarded attempts and dry runs) after the router answered; it must
	// not block.
	OnDecision func(model, requestID string, promptTokens int, d group.Decision)
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Tracing traces requests (OpenTelemetry); nil records nothing but
	// still passes a client's traceparent on to the engine.
	Tracing *tracing.Tracing
	// Bodies bounds the request bodies held at once by this front and
	// every other front of the process that shares it (the endpoint
	// picker takes it through Picker); nil: a Budget of
	// config.Config.BodyBudget of the Server's own.
	Bodies *bodybudget.Budget
}

// Server is the HTTP front. Safe for concurrent use.
type Server struct {
	// core is the routing core the fronts share (package admission).
	core    *admission.Core
	cfg     config.Config
	deps    Deps
	log     *slog.Logger
	m       *metrics
	models  map[string]*model
	tr      *tracing.Tracing
	lm      *listenerMetrics
	fm      *featureMetrics
	pdm     *pdMetrics
	handler http.Handler
	// admin serves config.Config.AdminListen (nil when it is not set); lm are
	// the listeners' metrics, bodies the body_budget (listener.go,
	// body.go).
	admin  http.Handler
	bodies *bodybudget.Budget
	// holds counts the exchanges writing each replica's series
	// (replicas.go); removed are the other fronts' hooks
	// (Picker.OnReplicaRemoved), under removedMu.
	holds     *frontmetrics.Holds
	removedMu sync.Mutex
	removed   []func(replica string)
	trust     *trust       // index trust per engine (trust.go)
	loads     adapterLoads // LoRA adapter loads under way

	// learned are client-chosen response ids (responsepin.go).
	learned learnedResponses
}

// model is one configured model group: admission's Group (configuration,
// router, tokenizer, features) and the HTTP front's engine transport.
type model struct {
	*admission.Group
	transport *http.Transport
	pd        *pdGroup // nil unless engines have roles (pd.go)
}

// New builds a Server from a defaults-filled, validated cfg. It starts no
// goroutines. All problems are returned at once.
func New(cfg config.Config, deps Deps, log *slog.Logger, reg prometheus.Registerer) (*Server, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	var errs []error
	if deps.Fleet == nil {
		errs = append(errs, errors.New("no fleet"))
	}
	s := &Server{cfg: cfg, deps: deps, log: log, models: map[string]*model{},
		tr: tracingOrDisabled(deps.Tracing)}
	groups := map[string]*admission.Group{}
	for i, mc := range cfg.Models {
		r := deps.Routers[mc.Name]
		if r == nil {
			errs = append(errs, fmt.Errorf("models[%d] %q: no router", i, mc.Name))
		}
		if deps.Fleet != nil && mc.Discovery == nil && len(deps.Fleet.Endpoints(mc.Name)) == 0 {
			errs = append(errs, fmt.Errorf("models[%d] %q: no engines in the fleet", i, mc.Name))
		}
		m := &model{Group: &admission.Group{Cfg: mc, Router: r, Tok: deps.Tokenizers[mc.Name]},
			transport: newTransport(mc.Timeouts, deps.EngineTLS), pd: newPDGroup(mc)}
		m.Features = newFeatures(s, &m.Cfg, m.pd)
		s.models[mc.Name] = m
		groups[mc.Name] = m.Group
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	s.m = m
	s.core = admission.New(cfg, groups, admission.Deps{Fleet: deps.Fleet, Metrics: m.front, View: m.view, Tracing: s.tr,
		Refuse: s.refuseClientControls, OnDecision: deps.OnDecision, Now: deps.Now}, log)
	s.holds = frontmetrics.NewHolds(m.view, func(r string) bool { return deps.Fleet.Endpoint(r) != nil })
	if s.fm, err = newFeatureMetrics(reg); err != nil {
		return nil, err
	}
	if s.trust, err = newTrust(s.log, reg, func(r string) bool { return deps.Fleet.Endpoint(r) != nil }); err != nil {
		return nil, err
	}
	s.removed = append(s.removed, s.trust.forget)
	for _, mc := range cfg.Models {
		var engines []string
		for _, ep := range deps.Fleet.Endpoints(mc.Name) {
			engines = append(engines, ep.Name())
			s.trust.init(ep.Name())
		}
		s.fm.initModel(mc, engines)
	}
	if s.pdm, err = newPDMetrics(reg); err != nil {
		return nil, err
	}
	if s.lm, err = newListenerMetrics(reg); err != nil {
		return nil, err
	}
	if s.bodies = deps.Bodies; s.bodies == nil {
		s.bodies = bodybudget.New(cfg.BodyBudget)
	}
	// Every series of a known label set exists from the start (0), not
	// from its first event: alerts see 0, not "no data".
	m.requests.WithLabelValues(modelUnknown, "", outcomeBadRequest)
	for _, mc := range cfg.Models {
		var replicas []string
		for _, ep := range deps.Fleet.Endpoints(mc.Name) {
			m.inFlight.WithLabelValues(ep.Name()).Set(0)
			replicas = append(replicas, ep.Name())
		}
		m.initModel(mc.Name, replicas, mc.Policy == config.PolicyShadow)
		if s.models[mc.Name].pd != nil {
			s.pdm.initModel(mc.Name)
		}
	}
	s.handler = s.routes(cfg.AdminListen == "")
	if cfg.AdminListen != "" {
		s.admin = s.adminRoutes()
	}
	return s, nil
}

// newTransport returns the engine transport of one model: its own
// connection pool, connect timeout, no compression (bytes are relayed as
// they come), many idle connections (thousands of concurrent streams); tc
// verifies https:// engines (nil: the system's roots).
func newTransport(t config.Timeouts, tc *tls.Config) *http.Transport {
	return &http.Transport{
		TLSClientConfig:     tc,
		DialContext:         (&net.Dialer{Timeout: t.Connect, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout: t.Connect,
		DisableCompression:  true,
		MaxIdleConns:        0,
		MaxIdleConnsPerHost: 2048,
		IdleConnTimeout:     90 * time.Second,
	}
}

// routes is the main listener's handler; introspection: whether it
// serves /metrics, /ui and /v1/route (no admin listener), behind the API
// key when one is set.
func (s *Server) routes(introspection bool) http.Handler {
	mux := http.NewServeMux()
	allow := map[string][]string{} // path -> methods served
	handle := func(method, path string, h http.Handler) {
		mux.Handle(method+" "+path, h)
		allow[path] = append(allow[path], method)
		if method == http.MethodGet { // ServeMux serves HEAD with GET
			allow[path] = append(allow[path], http.MethodHead)
		}
	}
	handle("POST", "/v1/completions", s.auth(func(w http.ResponseWriter, r *http.Request) { s.serveInference(w, r, request.Completion) }))
	handle("POST", "/v1/chat/completions", s.auth(func(w http.ResponseWriter, r *http.Request) { s.serveInference(w, r, request.Chat) }))
	// responses.go, responseget.go
	handle("POST", responsesPath, s.auth(s.serveResponses))
	handle("GET", responsesPath+"/{id}", s.auth(s.serveResponseByID))
	handle("POST", responsesPath+"/{id}/cancel", s.auth(s.serveResponseByID))
	if introspection {
		handle("POST", "/v1/route", s.auth(s.serveRoute))
	}
	for _, p := range passthroughPaths { // passthrough.go
		handle("POST", p, s.auth(s.servePassthrough))
	}
	handle("GET", "/v1/models", s.auth(s.serveModels))
	handle("GET", "/health", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) }))
	ready := s.serveReady
	if !introspection { // the admin listener lists the engines
		ready = s.serveReadySummary
	}
	handle("GET", "/ready", http.HandlerFunc(ready))
	if s.deps.Gatherer != nil && introspection {
		handle("GET", "/metrics", s.auth(promhttp.HandlerFor(s.deps.Gatherer, promhttp.HandlerOpts{}).ServeHTTP))
	}
	if s.deps.UI != nil && introspection {
		handle("GET", "/ui", s.deps.UI)
		handle("GET", "/ui/state", s.deps.UI)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		// "/" matches every method, so ServeMux's own 405 never happens:
		// a known path with another method is answered here.
		// The path as sent: "/v1/chat%2Fcompletions" is not a known path
		// (ServeMux did not match it), so it is a 404, not a 405.
		if methods, ok := allow[r.URL.EscapedPath()]; ok {
			w.Header().Set("Allow", strings.Join(methods, ", "))
			(&apiError{status: http.StatusMethodNotAllowed, typ: typeInvalidRequest,
				message: fmt.Sprintf("method %s not allowed on %s (allowed: %s)", r.Method, r.URL.Path, strings.Join(methods, ", "))}).write(w)
			return
		}
		(&apiError{status: http.StatusNotFound, typ: typeNotFound, message: fmt.Sprintf("no route for %s %s", truncate(r.Method, maxEcho), truncate(r.URL.Path, maxEcho))}).write(w)
	})
	return s.dropClientControls(canonical(mux))
}

// Handler returns the server's HTTP handler (for tests and embedding).
func (s *Server) Handler() http.Handler { return s.handler }

// auth checks the client's bearer token when config.Config.APIKey is set.
func (s *Server) auth(h http.HandlerFunc) http.HandlerFunc {
	if s.cfg.APIKey == "" {
		return h
	}
	want := "Bearer " + s.cfg.APIKey
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != want {
			(&apiError{status: http.StatusUnauthorized, typ: typeAuthentication, message: "invalid API key"}).write(w)
			return
		}
		h(w, r)
	}
}

func (s *Server) closeIdle() {
	for _, m := range s.models {
		m.transport.CloseIdleConnections()
	}
}

// requestID returns the client's x-request-id, or a new random one.
func requestID(r *http.Request) string {
	if id := r.Header.Get("X-Request-Id"); id != "" && len(id) <= 256 {
		return id
	}
	return admission.NewRequestID()
}
