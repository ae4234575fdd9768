package admission

import (
	"context"

	"kvrouter/internal/group"
	"kvrouter/internal/request"
)

// Feature is one optional per-request behaviour of a model group, as
// admission runs it (doc.go). Its stages after admission are the front's
// (Flow.Plug).
type Feature interface {
	// Admit checks x, whose group and request are known, and may add its
	// route stage (Flow.AddRoute); the error answers the request.
	Admit(ctx context.Context, x *Flow) *request.Error
}

// Rewriter is a Feature that may replace a request before it is checked:
// req was parsed from body and names group g (x.Group is not set yet);
// the result is the request as the group serves it.
type Rewriter interface {
	Feature
	Rewrite(ctx context.Context, x *Flow, g *Group, req *request.Parsed, body []byte) (*request.Parsed, *request.Error)
}

// AddRoute adds f to x's route stages, run in order by RouteInput before
// the media keys and the prefix_chars text: an adapter's LoRA key, a P/D
// decode leg routed by load.
func (x *Flow) AddRoute(f func(in *group.RouteInput)) {
	prev := x.route
	if prev == nil {
		x.route = f
		return
	}
	x.route = func(in *group.RouteInput) { prev(in); f(in) }
}
