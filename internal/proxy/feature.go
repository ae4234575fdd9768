package proxy

import (
	"context"
	"log/slog"

	"kvrouter/internal/admission"
	"kvrouter/internal/config"
	"kvrouter/internal/fleet"
)

// Features: the optional per-request behaviours of a model group (route
// aliases, LoRA adapters, media limits, response pinning, P/D legs). Each
// is a value registered once when the group is built (newFeatures) and
// run by admission (package admission: its Rewrite and Admit stages, for
// both fronts). The stages only the HTTP front runs are declared here as
// frontStages: admission calls the front back once per feature that
// passed (Server.admit), and the feature plugs its stages into the
// exchange's hooks. The hooks (a per-request set of stages, as
// httputil.ReverseProxy takes Rewrite, ModifyResponse and ErrorHandler)
// are what forward, relay and finish call at fixed points; a feature keeps
// its per-request state in the closures it plugs in. Every hook has a
// default that does nothing, so the request path calls them without
// asking which feature is there.
//
// A new per-request feature is a type in its own file of this package
// (as aliases.go, adapters.go, media.go, responsepin.go and pd.go are),
// registered in newFeatures, with admission.Feature's Admit (and
// admission.Rewriter's Rewrite if it changes the request before it is
// checked) for what the endpoint picker must do too, and plug for the
// HTTP front's stages; its router.yaml settings go in internal/config
// (features.go). A stage none of the hooks offers is a new hook field with
// its default and one call in the request path.

// frontStages is a feature with stages of the HTTP front: plug adds them
// to x.hooks once admission passed the feature; m is x's group.
type frontStages interface {
	plug(ctx context.Context, x *exchange, m *model)
}

// hooks are one request's stages of the HTTP front, plugged in by its
// group's features. (The route stage is admission's: Flow.AddRoute.)
// Each field is set by newHooks and never nil but filter; features compose
// with what is there.
type hooks struct {
	// engines narrows the group's healthy engines a request may use, in
	// place: an adapter's holders, a P/D leg's pool, a pinned response's
	// engine for this attempt. The error says why none is left.
	engines func(eps []*fleet.Endpoint) ([]*fleet.Endpoint, error)
	// plan runs once before the first attempt is routed; false when it
	// answered the request (a P/D prefill leg, a pinned response's 503).
	plan func(ctx context.Context, x *exchange) bool
	// explain answers a route-only request instead of the plain decision;
	// false: not handled (P/D's plan).
	explain func(ctx context.Context, x *exchange) bool
	// chosen runs once the router chose ep for an attempt, before the
	// request is sent; false when it answered the request (an adapter
	// that could not be loaded there).
	chosen func(ctx context.Context, x *exchange, ep *fleet.Endpoint) bool
	// body is the body sent to engine (default: the flow's Fwd).
	body func(engine string) []byte
	// retry reports whether an attempt (0-based) that failed with status
	// (0: a connection error, nothing received) may be followed by another
	// on another engine.
	retry func(attempt, status int) bool
	// filter, when not nil, rewrites the relayed answer: a whole
	// non-streaming body, or whole events (an alias's usage and
	// reasoning).
	filter func(b []byte) []byte
	// end runs in finish, before the request's series and log line, and
	// may add to the line (an alias's series, a P/D prefill replica, a
	// learned response id).
	end func(x *exchange, attrs []slog.Attr) []slog.Attr
}

// newHooks are x's default stages: nothing added, the group's retry
// policy.
func newHooks(x *exchange) hooks {
	return hooks{
		engines: func(eps []*fleet.Endpoint) ([]*fleet.Endpoint, error) { return eps, nil },
		plan:    func(context.Context, *exchange) bool { return true },
		explain: func(context.Context, *exchange) bool { return false },
		chosen:  func(context.Context, *exchange, *fleet.Endpoint) bool { return true },
		body:    func(string) []byte { return x.Fwd },
		retry: func(attempt, status int) bool {
			return attempt < x.m.Cfg.Retries && (status == 0 || retryableStatus(status))
		},
		end: func(_ *exchange, attrs []slog.Attr) []slog.Attr { return attrs },
	}
}

// addEngines narrows after the engines stages already there.
func (h *hooks) addEngines(f func(eps []*fleet.Endpoint) ([]*fleet.Endpoint, error)) {
	prev := h.engines
	h.engines = func(eps []*fleet.Endpoint) ([]*fleet.Endpoint, error) {
		eps, err := prev(eps)
		if err != nil {
			return eps, err
		}
		return f(eps)
	}
}

// addPlan runs f after the plan stages already there, while they go on.
func (h *hooks) addPlan(f func(ctx context.Context, x *exchange) bool) {
	prev := h.plan
	h.plan = func(ctx context.Context, x *exchange) bool { return prev(ctx, x) && f(ctx, x) }
}

// addEnd runs f after the end stages already there.
func (h *hooks) addEnd(f func(x *exchange, attrs []slog.Attr) []slog.Attr) {
	prev := h.end
	h.end = func(x *exchange, attrs []slog.Attr) []slog.Attr { return f(x, prev(x, attrs)) }
}

// newFeatures are the features of group mc in the order they run: route
// aliases (rewrite), LoRA adapters, media limits, response pinning, P/D.
func newFeatures(s *Server, mc *config.Model, pd *pdGroup) []admission.Feature {
	var fs []admission.Feature
	if len(mc.Aliases) > 0 {
		fs = append(fs, aliasFeature{s: s})
	}
	fs = append(fs, adapterFeature{s: s}) // adapters may be learned from the engines' listings
	fs = append(fs, mediaFeature{})
	fs = append(fs, pinFeature{s: s})
	if pd != nil {
		fs = append(fs, pdFeature{s: s, g: pd})
	}
	return fs
}

var (
	_ admission.Rewriter = aliasFeature{}
	_ frontStages        = aliasFeature{}
	_ frontStages        = adapterFeature{}
	_ frontStages        = pinFeature{}
	_ frontStages        = pdFeature{}
)
