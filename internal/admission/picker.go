package admission

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	"kvrouter/internal/bodybudget"
	"kvrouter/internal/config"
	"kvrouter/internal/fleet"
	"kvrouter/internal/frontmetrics"
	"kvrouter/internal/group"
	"kvrouter/internal/pick"
	"kvrouter/internal/request"
)

// Picker is admission for a front that does not forward requests
// itself: the Gateway API Inference Extension endpoint picker (package
// epp, which declares what it asks as epp.Picker), which tells the gateway
// where to send each request. It parses, validates, tokenizes and routes
// with the same Core, groups, routers, tokenizers and leases as the HTTP
// front, and answers in package pick's terms; only the forwarding is left
// to the gateway. Safe for concurrent use.
type Picker struct {
	s     *Core
	front *frontmetrics.Front // front="epp": its requests' tokenizer series
	pd    PickerDeps
}

// PickerDeps are what a Picker asks of the HTTP front that owns the
// process's metrics and readiness.
type PickerDeps struct {
	// Ready reports what GET /ready reports. Required.
	Ready func() bool
	// OnReplicaRemoved registers f, called with the name of each engine
	// removed from the fleet while serving. Required.
	OnReplicaRemoved func(f func(replica string))
	// CountClientControl counts a client control dropped or refused
	// (kvrouter_proxy_client_controls_total, by control). Nil: not counted.
	CountClientControl func(control string)
	// Bodies is the process's body budget (config.Config.BodyBudget),
	// shared with the HTTP front. Required.
	Bodies *bodybudget.Budget
}

// Picker returns s for another front: the endpoint picker, whose
// requests' tokenizer series (kvrouter_proxy_tokenize_*,
// kvrouter_proxy_tokenizer_unavailable_total) carry front="epp". The
// front's shadow series of the models in shadow mode are created at 0
// (the picker records them: Pick.Shadow).
func (s *Core) Picker(pd PickerDeps) *Picker {
	f := s.deps.Metrics.Front(frontmetrics.EPP)
	for name, g := range s.groups {
		if g.Cfg.Policy == config.PolicyShadow {
			f.InitShadow(name)
		}
	}
	return &Picker{s: s, front: f, pd: pd}
}

// FrontMetrics is the request metrics set the HTTP front registered, for
// another front of the same process to take its view of (one Set per
// registry).
func (p *Picker) FrontMetrics() *frontmetrics.Set { return p.s.deps.Metrics }

// OnReplicaRemoved registers f, called with the name of each engine
// removed from the fleet while serving, for another front to delete its
// series of it; f must not block.
func (p *Picker) OnReplicaRemoved(f func(replica string)) { p.pd.OnReplicaRemoved(f) }

// HasReplica reports whether the fleet has an engine named replica (still
// there, or added again under that name).
func (p *Picker) HasReplica(replica string) bool { return p.s.deps.Fleet.Endpoint(replica) != nil }

// Outcome of a request shed by pick.Input.MaxInFlight.
const outcomeShed = frontmetrics.OutcomeShed

// Pick routes a request through admission (Core.Admit, Core.TooLong,
// Core.RouteInput). It answers
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
		id = NewRequestID()
	}
	f := &Flow{Ctx: ctx, ID: id, Start: s.deps.Now(), Header: header, Metrics: p.front}
	k, ok := inferenceKind(in.Path)
	if !ok {
		return nil, p.fail(f, &answer{status: statusNotFound, typ: TypeNotFound, message: fmt.Sprintf("no route for POST %s", Truncate(in.Path, MaxEcho))}, frontmetrics.OutcomeBadRequest, nil)
	}
	if s.cfg.APIKey != "" && header("Authorization") != "Bearer "+s.cfg.APIKey {
		return nil, p.fail(f, &answer{status: statusUnauthorized, typ: TypeAuthentication, message: "invalid API key"}, frontmetrics.OutcomeBadRequest, nil)
	}
	if e := request.CheckContentType(header("Content-Type")); e != nil {
		return nil, p.fail(f, requestAnswer(e), frontmetrics.OutcomeBadRequest, nil)
	}
	if e := request.CheckContentEncoding(header("Content-Encoding")); e != nil {
		return nil, p.fail(f, requestAnswer(e), frontmetrics.OutcomeBadRequest, nil)
	}
	if int64(len(in.Body)) > s.cfg.BodyLimit {
		return nil, p.fail(f, p.tooLarge(), frontmetrics.OutcomeBadRequest, nil)
	}
	if e := s.Admit(ctx, f, k, in.Body); e != nil {
		return nil, p.fail(f, requestAnswer(e), frontmetrics.OutcomeBadRequest, nil)
	}
	if e := s.TooLong(ctx, f); e != nil {
		return nil, p.fail(f, requestAnswer(e), frontmetrics.OutcomeBadRequest, nil)
	}
	eps, retry, err := s.deps.Fleet.Healthy(nil, f.Req.Model)
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
			return nil, p.fail(f, &answer{status: statusTooManyRequests, typ: TypeRateLimit,
				message: fmt.Sprintf("every replica of model %q is at its limit of %d requests", f.Req.Model, in.MaxInFlight), retryAfter: time.Second}, outcomeShed, nil)
		case in.Allow != nil && len(eps) > 0:
			return nil, p.fail(f, &answer{status: statusServiceUnavailable, typ: TypeServiceUnavailable,
				message: fmt.Sprintf("no healthy replica of model %q in the gateway's endpoint subset", f.Req.Model), retryAfter: time.Second}, frontmetrics.OutcomeNoReplica, nil)
		default:
			if err == nil {
				err = fleet.ErrNoEndpoint
			}
			return nil, p.fail(f, noReplica(f.Req.Model, retry), frontmetrics.OutcomeNoReplica, err)
		}
	}
	t0 := time.Now()
	d, err := f.Group.Router.Route(s.RouteInput(ctx, f, cands, false))
	if err != nil {
		return nil, p.fail(f, serverAnswer("routing: "+err.Error()), frontmetrics.OutcomeUpstream, nil)
	}
	ep := s.deps.Fleet.Endpoint(d.Replica)
	if ep == nil || !slices.Contains(cands, d.Replica) {
		if d.Release != nil {
			d.Release()
		}
		return nil, p.fail(f, serverAnswer(fmt.Sprintf("router chose unknown replica %q", d.Replica)), frontmetrics.OutcomeUpstream, nil)
	}
	l := &lease{p: p, f: f, ep: ep, d: d, addr: EndpointAddr(ep)}
	pk := &pick.Pick{Model: f.Req.Model, Target: pick.Target{Replica: d.Replica, Addr: l.addr, CachedTokens: d.CachedTokens, APIKey: ep.APIKey()},
		Body: f.Fwd, PromptTokens: len(f.Tokens), Tokenized: f.Tokens != nil, Stream: f.Req.Stream, Lease: l}
	if d.Shadow != nil {
		pk.Shadow = &pick.Shadow{Replica: d.Shadow.Replica, CachedTokens: d.Shadow.CachedTokens}
	}
	pk.Fallbacks = p.fallbacks(ctx, f, cands, d.Replica)
	pk.Decision = time.Since(t0)
	ep.AddInFlight(1)
	return pk, nil
}

// fail is the *pick.Error for e: the HTTP front's status, body and
// Retry-After, the outcome, and cause (e when nil) for the log line.
func (p *Picker) fail(f *Flow, e *answer, outcome string, cause error) *pick.Error {
	pe := &pick.Error{Status: e.status, Body: e.body(), RetryAfter: RetryAfterSeconds(e.retryAfter), Outcome: outcome, Err: cause}
	if cause == nil {
		pe.Err = e
	}
	if _, ok := p.s.groups[f.Asked]; ok {
		pe.Model = f.Asked
	}
	return pe
}

// fallbacks are up to the model's Retries other candidates, each the
// router's choice (without a lease) among those not yet listed.
func (p *Picker) fallbacks(ctx context.Context, f *Flow, cands []string, chosen string) []string {
	var out []string
	rest := slices.DeleteFunc(slices.Clone(cands), func(n string) bool { return n == chosen })
	for range max(f.Group.Cfg.Retries, 0) {
		if len(rest) == 0 {
			break
		}
		d, err := f.Group.Router.Route(p.s.RouteInput(ctx, f, rest, true))
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
	f     *Flow
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
	model := l.f.Req.Model
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
	d, err := l.f.Group.Router.Route(s.RouteInput(l.f.Ctx, l.f, []string{to.Name()}, false))
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
func (p *Picker) Ready() bool { return p.pd.Ready() }

// TooLarge is the HTTP front's 413 for a body over config.Config.BodyLimit.
func (p *Picker) TooLarge() *pick.Error {
	e := p.tooLarge()
	return &pick.Error{Status: e.status, Body: e.body(), Outcome: frontmetrics.OutcomeBadRequest, Err: e}
}

func (p *Picker) tooLarge() *answer {
	return &answer{status: statusRequestEntityTooLarge, typ: TypeInvalidRequest,
		message: fmt.Sprintf("request body larger than %d bytes", p.s.cfg.BodyLimit)}
}

// BodyLimit is config.Config.BodyLimit, in bytes.
func (p *Picker) BodyLimit() int64 { return p.s.cfg.BodyLimit }

// Bodies is the budget of request bodies the process holds at once
// (config.Config.BodyBudget), shared with the HTTP front.
func (p *Picker) Bodies() *bodybudget.Budget { return p.pd.Bodies }

// AllowDPRank is config.Clients.AllowDPRank: whether a client's
// X-Data-Parallel-Rank header reaches the engine.
func (p *Picker) AllowDPRank() bool { return p.s.cfg.Clients.AllowDPRank }

// CountClientControl counts a client control ("dp_rank",
// "kv_transfer_params") the front dropped or refused.
func (p *Picker) CountClientControl(control string) {
	if p.pd.CountClientControl != nil {
		p.pd.CountClientControl(control)
	}
}

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
