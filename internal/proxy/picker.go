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

	"kvrouter/internal/config"
	"kvrouter/internal/fleet"
	"kvrouter/internal/frontmetrics"
	"kvrouter/internal/group"
	"kvrouter/internal/pick"
	"kvrouter/internal/request"
)

// Picker is a Server's routing core for a front that does not forward
// requests itself: the Gateway API Inference Extension endpoint picker
// (package epp, which declares what it asks as epp.Picker), which tells
// the gateway where to send each request. It parses, validates, tokenizes
// and routes with the same code (core.go), models, routers, tokenizers and
// leases as the HTTP front, and answers in package pick's terms; only the
// forwarding is left to the gateway. Safe for concurrent use.
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
		if m.cfg.Policy == config.PolicyShadow {
			f.InitShadow(name)
		}
	}
	return &Picker{s: s, front: f}
}

// FrontMetrics is the request metrics set the HTTP front registered, for
// another front of the same process to take its view of (one Set per
// registry).
func (p *Picker) FrontMetrics() *frontmetrics.Set { return p.s.m.front }

// Outcome of a request shed by pick.Input.MaxInFlight.
const outcomeShed = frontmetrics.OutcomeShed

// Pick routes a request through the routing core (core.go). It answers
// every error the HTTP front would answer before forwarding (bad body,
// unknown model, prompt too long, no replica), as a *pick.Error. A Pick
// holds a load lease on its replica and predicted blocks until End.
func (p *Picker) Pick(ctx context.Context, in pick.Input) (*pick.Pick, *pick.Error) {
	s := p.s
	header := noHeader
	if in.Header != nil {
		header = func(name string) string { return in.Header(strings.ToLower(name)) }
	}
	id := in.RequestID
	if id == "" {
		id = newRequestID()
	}
	f := &flow{ctx: ctx, id: id, start: s.deps.Now(), header: header, front: p.front}
	k, ok := inferenceKind(in.Path)
	if !ok {
		return nil, p.fail(f, &apiError{status: http.StatusNotFound, typ: typeNotFound, message: fmt.Sprintf("no route for POST %s", truncate(in.Path, maxEcho))}, outcomeBadRequest, nil)
	}
	if s.cfg.APIKey != "" && header("Authorization") != "Bearer "+s.cfg.APIKey {
		return nil, p.fail(f, &apiError{status: http.StatusUnauthorized, typ: typeAuthentication, message: "invalid API key"}, outcomeBadRequest, nil)
	}
	if e := request.CheckContentType(header("Content-Type")); e != nil {
		return nil, p.fail(f, requestError(e), outcomeBadRequest, nil)
	}
	if int64(len(in.Body)) > s.cfg.BodyLimit {
		return nil, p.fail(f, p.tooLarge(), outcomeBadRequest, nil)
	}
	if e := s.admit(ctx, f, k, in.Body); e != nil {
		return nil, p.fail(f, requestError(e), outcomeBadRequest, nil)
	}
	if e := s.tooLong(f); e != nil {
		return nil, p.fail(f, requestError(e), outcomeBadRequest, nil)
	}
	eps, retry, err := s.deps.Fleet.Healthy(nil, f.req.Model)
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
			return nil, p.fail(f, &apiError{status: http.StatusTooManyRequests, typ: typeRateLimit,
				message: fmt.Sprintf("every replica of model %q is at its limit of %d requests", f.req.Model, in.MaxInFlight), retryAfter: time.Second}, outcomeShed, nil)
		case in.Allow != nil && len(eps) > 0:
			return nil, p.fail(f, &apiError{status: http.StatusServiceUnavailable, typ: typeServiceUnavailable,
				message: fmt.Sprintf("no healthy replica of model %q in the gateway's endpoint subset", f.req.Model), retryAfter: time.Second}, outcomeNoReplica, nil)
		default:
			if err == nil {
				err = fleet.ErrNoEndpoint
			}
			return nil, p.fail(f, noReplicaError(f, retry), outcomeNoReplica, err)
		}
	}
	t0 := time.Now()
	d, err := f.m.router.Route(s.routeInput(f, cands, false))
	if err != nil {
		return nil, p.fail(f, serverError("routing: "+err.Error()), outcomeUpstream, nil)
	}
	ep := s.deps.Fleet.Endpoint(d.Replica)
	if ep == nil || !slices.Contains(cands, d.Replica) {
		if d.Release != nil {
			d.Release()
		}
		return nil, p.fail(f, serverError(fmt.Sprintf("router chose unknown replica %q", d.Replica)), outcomeUpstream, nil)
	}
	l := &lease{p: p, f: f, ep: ep, d: d, addr: EndpointAddr(ep)}
	pk := &pick.Pick{Model: f.req.Model, Target: pick.Target{Replica: d.Replica, Addr: l.addr, CachedTokens: d.CachedTokens, APIKey: ep.APIKey()},
		Body: f.fwd, PromptTokens: len(f.tokens), Tokenized: f.tokens != nil, Stream: f.req.Stream, Lease: l}
	if d.Shadow != nil {
		pk.Shadow = &pick.Shadow{Replica: d.Shadow.Replica, CachedTokens: d.Shadow.CachedTokens}
	}
	pk.Fallbacks = p.fallbacks(f, cands, d.Replica)
	pk.Decision = time.Since(t0)
	ep.AddInFlight(1)
	return pk, nil
}

// fail is the *pick.Error for e: the HTTP front's status, body and
// Retry-After, the outcome, and cause (e when nil) for the log line.
func (p *Picker) fail(f *flow, e *apiError, outcome string, cause error) *pick.Error {
	pe := &pick.Error{Status: e.status, Body: e.body(), RetryAfter: retryAfterSeconds(e.retryAfter), Outcome: outcome, Err: cause}
	if cause == nil {
		pe.Err = e
	}
	if _, ok := p.s.models[f.asked]; ok {
		pe.Model = f.asked
	}
	return pe
}

// fallbacks are up to the model's Retries other candidates, each the
// router's choice (without a lease) among those not yet listed.
func (p *Picker) fallbacks(f *flow, cands []string, chosen string) []string {
	var out []string
	rest := slices.DeleteFunc(slices.Clone(cands), func(n string) bool { return n == chosen })
	for range max(f.m.cfg.Retries, 0) {
		if len(rest) == 0 {
			break
		}
		d, err := f.m.router.Route(p.s.routeInput(f, rest, true))
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

// lease is a Pick's hold on its engine: the decision's load lease and
// predicted blocks, and the engine's in-flight count (pick.Lease).
type lease struct {
	p     *Picker
	f     *flow
	ep    *fleet.Endpoint
	addr  string
	d     group.Decision
	ended bool
	ok    bool // Status saw 2xx and nothing failed since
	first bool
}

var _ pick.Lease = (*lease)(nil)

// Served moves the lease to the engine at addr (pick.Pick.Served).
func (l *lease) Served(addr string) (pick.Target, bool, error) {
	if l.ended || addr == "" || addr == l.addr {
		return pick.Target{}, false, nil
	}
	s := l.p.s
	model := l.f.req.Model
	var to *fleet.Endpoint
	for _, ep := range s.deps.Fleet.Endpoints(model) {
		if EndpointAddr(ep) == addr {
			to = ep
			break
		}
	}
	l.drop()
	if to == nil {
		l.ended = true
		return pick.Target{}, false, fmt.Errorf("served endpoint %s is no engine of model %q", addr, model)
	}
	d, err := l.f.m.router.Route(s.routeInput(l.f, []string{to.Name()}, false))
	if err != nil {
		l.ended = true
		return pick.Target{}, false, fmt.Errorf("routing onto served endpoint %s: %w", addr, err)
	}
	l.d, l.ep, l.addr = d, to, addr
	to.AddInFlight(1)
	return pick.Target{Replica: to.Name(), Addr: addr, CachedTokens: d.CachedTokens, APIKey: to.APIKey()}, true, nil
}

// drop ends the current lease as failed (its predictions go).
func (l *lease) drop() {
	if l.d.Failed != nil {
		l.d.Failed()
	}
	if l.d.Release != nil {
		l.d.Release()
	}
	l.ep.AddInFlight(-1)
	l.d = group.Decision{}
}

// Status records the engine's response status: passive health (as the
// HTTP front reports every answer) and, for a status other than 2xx, the
// predicted blocks dropped at once.
func (l *lease) Status(code int) {
	if l.ended {
		return
	}
	l.p.s.deps.Fleet.Report(l.ep, fleet.OutcomeOf(code))
	l.ok = code/100 == 2
	if !l.ok && l.d.Failed != nil {
		l.d.Failed()
	}
}

// FirstByte records that the first response byte reached the client (the
// request moves from prefill to decode in the load model); once.
func (l *lease) FirstByte() {
	if l.ended || l.first {
		return
	}
	l.first = true
	if l.d.FirstToken != nil {
		l.d.FirstToken()
	}
}

// End releases the lease: ok when the engine answered 2xx and the whole
// response went through; otherwise the predicted blocks are dropped
// first. Idempotent: only the first call counts.
func (l *lease) End(ok bool) {
	if l.ended {
		return
	}
	l.ended = true
	if (!ok || !l.ok) && l.d.Failed != nil {
		l.d.Failed()
	}
	if l.d.Release != nil {
		l.d.Release()
	}
	l.ep.AddInFlight(-1)
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

// TooLarge is the HTTP front's 413 for a body over config.Config.BodyLimit.
func (p *Picker) TooLarge() *pick.Error {
	e := p.tooLarge()
	return &pick.Error{Status: e.status, Body: e.body(), Outcome: outcomeBadRequest, Err: e}
}

func (p *Picker) tooLarge() *apiError {
	return &apiError{status: http.StatusRequestEntityTooLarge, typ: typeInvalidRequest,
		message: fmt.Sprintf("request body larger than %d bytes", p.s.cfg.BodyLimit)}
}

// BodyLimit is config.Config.BodyLimit, in bytes.
func (p *Picker) BodyLimit() int64 { return p.s.cfg.BodyLimit }

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
