package fleet

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// group is one model name's panic state; it lives as long as the fleet.
type group struct {
	model string

	panic atomic.Bool // below Config.PanicThreshold, as last evaluated
	// gaugeMu orders the gauge's updates: each sets the state current
	// under it, so racing changes leave the gauge at the last state.
	gaugeMu sync.Mutex
}

// panicking reports whether up of n endpoints is below the threshold.
func (f *Fleet) panicking(up, n int) bool {
	return f.cfg.PanicThreshold > 0 && float64(up) < f.cfg.PanicThreshold*float64(n)
}

// setPanic records g's panic state and, on a change, sets
// kvrouter_fleet_panic_mode and logs one line (one atomic load when
// nothing changed: Healthy calls it per request).
func (f *Fleet) setPanic(g *members, on bool, up, soft int) {
	if g.panic.Load() == on || !g.panic.CompareAndSwap(!on, on) {
		return
	}
	g.gaugeMu.Lock()
	v := 0.0
	if g.panic.Load() {
		v = 1
	}
	f.m.panic.WithLabelValues(g.model).Set(v)
	g.gaugeMu.Unlock()
	n := g.admitted()
	if on {
		f.log.Warn("panic mode: too few endpoints up; routing over the ones down for timeouts too",
			"model", g.model, "up", up, "timed_out", soft, "endpoints", n, "threshold", f.cfg.PanicThreshold)
		return
	}
	f.log.Info("panic mode over", "model", g.model, "up", up, "endpoints", n, "threshold", f.cfg.PanicThreshold)
}

// refreshPanic re-evaluates the panic state of every model of ep, after a
// change of its health.
func (f *Fleet) refreshPanic(ep *Endpoint) {
	v := f.view()
	for _, m := range ep.models {
		if g := v.byModel[m]; g != nil {
			f.refreshGroup(g)
		}
	}
}

// Healthy appends to dst the endpoints of model that may receive traffic
// now, in configuration order, and returns it: the ones up and, when fewer
// than Config.PanicThreshold of them are up (panic mode), also the ones
// down for timeouts alone. It returns ErrNoEndpoint (wrapped with the
// model) and how long until the first down endpoint may return when there
// are none.
func (f *Fleet) Healthy(dst []*Endpoint, model string) ([]*Endpoint, time.Duration, error) {
	g, ok := f.view().byModel[model]
	if !ok {
		return dst, 0, fmt.Errorf("model %q: %w", model, ErrNoEndpoint)
	}
	now := f.cfg.Now()
	noProbe := f.cfg.ProbeInterval < 0
	n := len(dst)
	var retry time.Duration = -1
	soft, admitted := 0, 0
	for _, ep := range g.eps {
		if !ep.Admitted() {
			continue // its source took it out (draining, not ready)
		}
		admitted++
		up, s, until := ep.usable(now, noProbe)
		if up {
			dst = append(dst, ep)
			continue
		}
		if s {
			soft++
		}
		if d := until.Sub(now); retry < 0 || d < retry {
			retry = d
		}
	}
	up := len(dst) - n
	inPanic := f.panicking(up, admitted)
	f.setPanic(g, inPanic, up, soft)
	if inPanic && soft > 0 {
		// Again in configuration order, with the soft-down ones.
		dst = dst[:n]
		for _, ep := range g.eps {
			if !ep.Admitted() {
				continue
			}
			if u, s, _ := ep.usable(now, noProbe); u || s {
				dst = append(dst, ep)
			}
		}
	}
	if len(dst) == n {
		if retry <= 0 {
			retry = f.cfg.BackoffBase
		}
		return dst, retry, fmt.Errorf("model %q: %w", model, ErrNoEndpoint)
	}
	return dst, 0, nil
}

// Panic reports whether model is in panic mode (see Config.PanicThreshold)
// as last evaluated: by Healthy, or by a probe or report that changed an
// endpoint's health.
func (f *Fleet) Panic(model string) bool {
	g := f.view().byModel[model]
	if g == nil {
		return false
	}
	return g.panic.Load()
}

// Ready reports whether every model has at least one routable endpoint
// (EndpointState.Routable).
func (f *Fleet) Ready() bool {
	for m := range f.view().byModel {
		ok := false
		for _, st := range f.States(m) {
			if st.Routable() {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// EndpointState is one endpoint's health at one moment, for one model.
type EndpointState struct {
	// Name is the endpoint's label.
	Name string
	// Up: the endpoint may receive traffic now (not ejected, or its
	// backoff is over when probes are off).
	Up bool
	// Probed: a /health probe has succeeded since start (always true when
	// probes are off).
	Probed bool
	// Panic: down for timeouts alone and routed anyway, because the model
	// is in panic mode (Config.PanicThreshold).
	Panic bool
	// ModelMissing: the engine's last GET /v1/models listing lacks the
	// model name (false before a listing succeeds).
	ModelMissing bool
	// Admitted: the endpoint's source lets it take new requests (false
	// while Kubernetes reports it not ready or terminating; see
	// Fleet.SetRoutable).
	Admitted bool
}

// Routable reports whether the endpoint takes the model's traffic (up, or
// routed in panic mode), has passed a probe and does not list the model as
// missing: what readiness counts.
func (s EndpointState) Routable() bool {
	return s.Admitted && (s.Up || s.Panic) && s.Probed && !s.ModelMissing
}

// States returns the state of every endpoint of model in configuration
// order; nil for an unknown model.
func (f *Fleet) States(model string) []EndpointState {
	g := f.view().byModel[model]
	if g == nil {
		return nil
	}
	now := f.cfg.Now()
	out := make([]EndpointState, len(g.eps))
	up, soft := 0, 0
	for i, ep := range g.eps {
		u, s, _ := ep.usable(now, f.cfg.ProbeInterval < 0)
		out[i] = EndpointState{Name: ep.name, Up: u, Panic: s, Probed: ep.wasProbed(), ModelMissing: ep.modelMissing(model), Admitted: ep.Admitted()}
		if !out[i].Admitted {
			continue
		}
		if u {
			up++
		} else if s {
			soft++
		}
	}
	inPanic := f.panicking(up, g.admitted())
	f.setPanic(g, inPanic, up, soft)
	for i := range out {
		out[i].Panic = out[i].Panic && inPanic
	}
	return out
}
