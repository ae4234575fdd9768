package proxy

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"kvrouter/internal/fleet"
	"kvrouter/internal/frontmetrics"
	"kvrouter/internal/request"
)

// Picker is a Server's routing core for a front that does not forward
// requests itself: the Gateway API Inference Extension endpoint picker
// (package epp), which tells the gateway where to send each request. It
// parses, validates, tokenizes and routes with the same code, models,
// routers, tokenizers and leases as the HTTP front; only the forwarding is
// left to the gateway. Safe for concurrent use.
type Picker struct {
	s     *Server
	front *frontmetrics.Front // front="epp": its requests' tokenizer series
}

// Picker returns s's routing core for another front: the endpoint picker,
// whose requests' tokenizer series (kvrouter_proxy_tokenize_*,
// kvrouter_proxy_tokenizer_unavailable_total) carry front="epp". The
// front's shadow series of the models in shadow mode are created at 0
// (the picker records them: Pick.Shadow).
func (s *Server) Picker() *Picker {
	f := s.m.front.Front(frontmetrics.EPP)
	for name, m := range s.models {
		if m.cfg.Policy == PolicyShadow {
			f.InitShadow(name)
		}
	}
	return &Picker{s: s, front: f}
}

// FrontMetrics is the request metrics set the HTTP front registered, for
// another front of the same process to take its view of (one Set per
// registry).
func (p *Picker) FrontMetrics() *frontmetrics.Set { return p.s.m.front }

// PickInput is one request as a gateway saw it.
type PickInput struct {
	// Path is the request's :path ("/v1/chat/completions?x=1" is read as
	// "/v1/chat/completions").
	Path string
	// Header returns a request header's first value ("" when absent);
	// names are case-insensitive. Nil: no headers.
	Header func(name string) string
	// Body is the complete request body.
	Body []byte
	// RequestID is the request's x-request-id, or "" (one is made).
	RequestID string
	// Allow, when not nil, limits the candidates to the endpoints whose
	// address ("ip:port") it accepts: the gateway's subset hint.
	Allow func(addr string) bool
	// MaxInFlight, when positive, is the most requests an endpoint may
	// have open through this front; a request whose every candidate is
	// at it is shed (429).
	MaxInFlight int64
}

// PickError is a request the picker answers itself, before any engine saw
// it: Status with Body, OpenAI's error JSON ({"error": {"message", "type",
// "param", "code"}}), the same body the HTTP front answers.
type PickError struct {
	Status int
	Body   []byte
	// RetryAfter, when positive, is the Retry-After header value in whole
	// seconds (503 without a replica, 429).
	RetryAfter int
	// Outcome is a kvrouter_proxy_requests_total outcome (package
	// frontmetrics): bad_request, no_replica, upstream_error, or shed (429).
	Outcome string
	// Model is the configured model the request named, or "" (unknown or
	// unread): a bounded metric label.
	Model string
	// Err is the cause for the log line.
	Err error
}

// Error is the status and body, for logs.
func (e *PickError) Error() string { return fmt.Sprintf("%d: %s", e.Status, e.Body) }

// Outcome of a request shed by PickInput.MaxInFlight.
const outcomeShed = frontmetrics.OutcomeShed

// Pick is one routed request: where it goes and the lease it holds there
// until End. Not safe for concurrent use (one gateway stream owns it);
// End is idempotent.
type Pick struct {
	// Model is the request's configured model.
	Model string
	// Replica is the chosen engine's name; Addr its "ip:port" (the URL's
	// host and port).
	Replica, Addr string
	// Fallbacks are the next endpoints' addresses in the router's order
	// (ModelConfig.Retries of them at most), for the gateway's retries.
	Fallbacks []string
	// Body is the body to send upstream (vllm_xargs.kv_cache_report_mode
	// merged in unless the model disables it).
	Body []byte
	// CachedTokens is the predicted prefix-cache hit on Replica, in tokens.
	CachedTokens int
	// PromptTokens is the prompt's length in tokens, 0 when unknown.
	PromptTokens int
	// Tokenized tells whether the prompt's token ids were known.
	Tokenized bool
	// Stream is the request's "stream".
	Stream bool
	// APIKey is the chosen engine's API key ("" when none).
	APIKey string
	// Decision is how long routing took (the router's Route calls).
	Decision time.Duration
	// Shadow, in shadow mode (policy shadow), is what the kv policy would
	// have chosen for this request when it was picked; nil otherwise. It is
	// set once, by Pick: the fallbacks and Served do not change it.
	Shadow *ShadowDecision

	p     *Picker
	x     *exchange
	ep    *fleet.Endpoint
	d     Decision
	ended bool
	ok    bool // Status saw 2xx and nothing failed since
	first bool
}

// Pick routes a request. It answers every error the HTTP front would
// answer before forwarding (bad body, unknown model, prompt too long,
// no replica), as a *PickError. A Pick holds a load lease on its replica
// and predicted blocks until End.
func (p *Picker) Pick(ctx context.Context, in PickInput) (*Pick, *PickError) {
	s := p.s
	x, rec := p.exchange(ctx, in)
	perr := func() *PickError {
		pe := &PickError{Status: rec.status, Body: []byte(rec.body.String()), Outcome: x.outcome, Err: x.err}
		if ra := rec.h.Get("Retry-After"); ra != "" {
			_, _ = fmt.Sscan(ra, &pe.RetryAfter)
		}
		if _, ok := s.models[x.asked]; ok {
			pe.Model = x.asked
		}
		return pe
	}
	k, ok := inferenceKind(in.Path)
	if !ok {
		s.fail(x, &apiError{status: http.StatusNotFound, typ: typeNotFound, message: fmt.Sprintf("no route for POST %s", truncate(in.Path, maxEcho))}, outcomeBadRequest)
		return nil, perr()
	}
	if s.cfg.APIKey != "" && x.r.Header.Get("Authorization") != "Bearer "+s.cfg.APIKey {
		s.fail(x, &apiError{status: http.StatusUnauthorized, typ: typeAuthentication, message: "invalid API key"}, outcomeBadRequest)
		return nil, perr()
	}
	if e := checkContentType(x.r.Header.Get("Content-Type")); e != nil {
		s.fail(x, e, outcomeBadRequest)
		return nil, perr()
	}
	if int64(len(in.Body)) > s.cfg.BodyLimit {
		s.fail(x, p.tooLarge(), outcomeBadRequest)
		return nil, perr()
	}
	if !s.parse(x, k, in.Body) {
		return nil, perr()
	}
	if e := s.tooLong(x); e != nil {
		s.fail(x, e, outcomeBadRequest)
		return nil, perr()
	}
	eps, retry, err := s.deps.Fleet.Healthy(nil, x.req.Model)
	var cands []string
	shed := false
	for _, ep := range eps {
		if in.Allow != nil && !in.Allow(EndpointAddr(ep)) {
			continue
		}
		if in.MaxInFlight > 0 && ep.InFlight() >= in.MaxInFlight {
			shed = true
			continue
		}
		cands = append(cands, ep.Name())
	}
	if len(cands) == 0 {
		switch {
		case shed:
			s.fail(x, &apiError{status: http.StatusTooManyRequests, typ: typeRateLimit,
				message: fmt.Sprintf("every replica of model %q is at its limit of %d requests", x.req.Model, in.MaxInFlight), retryAfter: time.Second}, outcomeShed)
		case in.Allow != nil && len(eps) > 0:
			s.fail(x, &apiError{status: http.StatusServiceUnavailable, typ: typeServiceUnavailable,
				message: fmt.Sprintf("no healthy replica of model %q in the gateway's endpoint subset", x.req.Model), retryAfter: time.Second}, outcomeNoReplica)
		default:
			if err == nil {
				err = fleet.ErrNoEndpoint
			}
			s.noReplica(x, retry, err)
		}
		return nil, perr()
	}
	t0 := time.Now()
	d, err := x.m.router.Route(s.routeInput(x, cands, false))
	if err != nil {
		s.fail(x, serverError("routing: "+err.Error()), outcomeUpstream)
		return nil, perr()
	}
	ep := s.deps.Fleet.Endpoint(d.Replica)
	if ep == nil || !slices.Contains(cands, d.Replica) {
		if d.Release != nil {
			d.Release()
		}
		s.fail(x, serverError(fmt.Sprintf("router chose unknown replica %q", d.Replica)), outcomeUpstream)
		return nil, perr()
	}
	pk := &Pick{Model: x.req.Model, Replica: d.Replica, Addr: EndpointAddr(ep), Body: x.fwd, CachedTokens: d.CachedTokens,
		PromptTokens: len(x.tokens), Tokenized: x.tokens != nil, Stream: x.req.Stream, APIKey: ep.APIKey(), Shadow: d.Shadow, p: p, x: x, ep: ep, d: d}
	pk.Fallbacks = p.fallbacks(x, cands, d.Replica)
	pk.Decision = time.Since(t0)
	ep.AddInFlight(1)
	return pk, nil
}

// fallbacks are up to the model's Retries other candidates, each the
// router's choice (without a lease) among those not yet listed.
func (p *Picker) fallbacks(x *exchange, cands []string, chosen string) []string {
	var out []string
	rest := slices.DeleteFunc(slices.Clone(cands), func(n string) bool { return n == chosen })
	for range max(x.m.cfg.Retries, 0) {
		if len(rest) == 0 {
			break
		}
		d, err := x.m.router.Route(p.s.routeInput(x, rest, true))
		if err != nil || !slices.Contains(rest, d.Replica) {
			break
		}
		if d.Release != nil {
			d.Release()
		}
		if ep := p.s.deps.Fleet.Endpoint(d.Replica); ep != nil {
			out = append(out, EndpointAddr(ep))
		}
		rest = slices.DeleteFunc(rest, func(n string) bool { return n == d.Replica })
	}
	return out
}

// Served tells the pick which endpoint ("ip:port") the gateway sent the
// request to. When it is another of the model's engines, the lease and
// the predicted blocks move there (the pick's are dropped, the served
// engine's recorded); moved reports that. An address that is no engine of
// the model ends the lease (nothing is known of where the request is) and
// returns an error.
func (pk *Pick) Served(addr string) (moved bool, err error) {
	if pk.ended || addr == "" || addr == pk.Addr {
		return false, nil
	}
	s := pk.p.s
	var to *fleet.Endpoint
	for _, ep := range s.deps.Fleet.Endpoints(pk.Model) {
		if EndpointAddr(ep) == addr {
			to = ep
			break
		}
	}
	pk.drop()
	if to == nil {
		pk.ended = true
		return false, fmt.Errorf("served endpoint %s is no engine of model %q", addr, pk.Model)
	}
	d, err := pk.x.m.router.Route(s.routeInput(pk.x, []string{to.Name()}, false))
	if err != nil {
		pk.ended = true
		return false, fmt.Errorf("routing onto served endpoint %s: %w", addr, err)
	}
	pk.d, pk.ep, pk.Replica, pk.Addr, pk.CachedTokens, pk.APIKey = d, to, to.Name(), addr, d.CachedTokens, to.APIKey()
	to.AddInFlight(1)
	return true, nil
}

// drop ends the current lease as failed (its predictions go).
func (pk *Pick) drop() {
	if pk.d.Failed != nil {
		pk.d.Failed()
	}
	if pk.d.Release != nil {
		pk.d.Release()
	}
	pk.ep.AddInFlight(-1)
	pk.d = Decision{}
}

// Status records the engine's response status: passive health (as the
// HTTP front reports every answer) and, for a status other than 2xx, the
// predicted blocks dropped at once.
func (pk *Pick) Status(code int) {
	if pk.ended {
		return
	}
	pk.p.s.deps.Fleet.Report(pk.ep, fleet.OutcomeOf(code))
	pk.ok = code/100 == 2
	if !pk.ok && pk.d.Failed != nil {
		pk.d.Failed()
	}
}

// FirstByte records that the first response byte reached the client (the
// request moves from prefill to decode in the load model); once.
func (pk *Pick) FirstByte() {
	if pk.ended || pk.first {
		return
	}
	pk.first = true
	if pk.d.FirstToken != nil {
		pk.d.FirstToken()
	}
}

// End releases the lease: ok when the engine answered 2xx and the whole
// response went through; otherwise the predicted blocks are dropped
// first. Idempotent: only the first call counts.
func (pk *Pick) End(ok bool) {
	if pk.ended {
		return
	}
	pk.ended = true
	if (!ok || !pk.ok) && pk.d.Failed != nil {
		pk.d.Failed()
	}
	if pk.d.Release != nil {
		pk.d.Release()
	}
	pk.ep.AddInFlight(-1)
}

// Endpoint picks an endpoint for a request that is no inference request
// (GET /v1/models, a health check through the gateway): the first healthy
// engine of the first model that has one, in configuration order, without
// a lease. ok is false when no engine is healthy.
func (p *Picker) Endpoint(allow func(addr string) bool) (addr string, ok bool) {
	_, addr, ok = p.EndpointNamed(allow)
	return addr, ok
}

// EndpointNamed is Endpoint with the engine's name too (the replica label
// of the request's series).
func (p *Picker) EndpointNamed(allow func(addr string) bool) (name, addr string, ok bool) {
	for _, mc := range p.s.cfg.Models {
		eps, _, _ := p.s.deps.Fleet.Healthy(nil, mc.Name)
		for _, ep := range eps {
			if a := EndpointAddr(ep); allow == nil || allow(a) {
				return ep.Name(), a, true
			}
		}
	}
	return "", "", false
}

// Ready reports what GET /ready reports: every model has an engine up,
// probed and, on the event-fed index, with its KV event stream connected.
func (p *Picker) Ready() bool { return p.s.readiness(false).Ready }

// TooLarge is the HTTP front's 413 for a body over Config.BodyLimit.
func (p *Picker) TooLarge() *PickError {
	e := p.tooLarge()
	return &PickError{Status: e.status, Body: e.body(), Outcome: outcomeBadRequest, Err: e}
}

func (p *Picker) tooLarge() *apiError {
	return &apiError{status: http.StatusRequestEntityTooLarge, typ: typeInvalidRequest,
		message: fmt.Sprintf("request body larger than %d bytes", p.s.cfg.BodyLimit)}
}

// BodyLimit is Config.BodyLimit, in bytes.
func (p *Picker) BodyLimit() int64 { return p.s.cfg.BodyLimit }

// ErrorBody is OpenAI's error JSON for status with message and type typ
// ("invalid_request_error", "service_unavailable_error", ...; "" picks
// the status's usual type), for errors a front makes itself.
func ErrorBody(status int, typ, message string) []byte {
	if typ == "" {
		switch {
		case status == http.StatusServiceUnavailable:
			typ = typeServiceUnavailable
		case status == http.StatusTooManyRequests:
			typ = typeRateLimit
		case status >= 500:
			typ = typeServer
		default:
			typ = typeInvalidRequest
		}
	}
	return (&apiError{status: status, typ: typ, message: message}).body()
}

// typeRateLimit is the type of a 429 the router answers (a shed request).
const typeRateLimit = "rate_limit_error"

// EndpointAddr is ep's address as a gateway names it: its URL's host and
// port ("10.0.0.7:8000"), the port defaulting to the scheme's.
func EndpointAddr(ep *fleet.Endpoint) string {
	u, err := url.Parse(ep.URL())
	if err != nil {
		return ep.URL()
	}
	if u.Port() != "" {
		return u.Host
	}
	port := "80"
	if u.Scheme == "https" {
		port = "443"
	}
	return net.JoinHostPort(u.Hostname(), port)
}

func inferenceKind(path string) (request.Kind, bool) {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	switch path {
	case request.Chat.Path():
		return request.Chat, true
	case request.Completion.Path():
		return request.Completion, true
	}
	return 0, false
}

// exchange builds the HTTP front's request state for in, answering into a
// pickRecorder so that every error is the HTTP front's own.
func (p *Picker) exchange(ctx context.Context, in PickInput) (*exchange, *pickRecorder) {
	r, _ := http.NewRequestWithContext(ctx, http.MethodPost, "/", http.NoBody) // "/" always parses
	if in.Header != nil {
		for _, h := range append([]string{"Authorization", "Content-Type"}, p.sessionHeaders()...) {
			if v := in.Header(strings.ToLower(h)); v != "" {
				r.Header.Set(h, v)
			}
		}
	}
	id := in.RequestID
	if id == "" {
		id = requestID(r)
	}
	rec := &pickRecorder{h: http.Header{}}
	return &exchange{w: rec, r: r, id: id, start: p.s.deps.Now(), front: p.front}, rec
}

// sessionHeaders are the session headers of every model.
func (p *Picker) sessionHeaders() []string {
	var out []string
	for _, mc := range p.s.cfg.Models {
		for _, h := range mc.SessionHeaders {
			if !slices.Contains(out, h) {
				out = append(out, h)
			}
		}
	}
	return out
}

// pickRecorder is the http.ResponseWriter the picker's errors are written to.
type pickRecorder struct {
	h      http.Header
	status int
	body   strings.Builder
}

func (r *pickRecorder) Header() http.Header { return r.h }
func (r *pickRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}
func (r *pickRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.WriteString(string(b))
}
