package fleet

import (
	"fmt"
	"slices"
)

// view is one immutable state of the fleet's membership.
type view struct {
	all     []*Endpoint
	byModel map[string]*members
}

// members are a model's group (its panic state) and its endpoints in one
// view.
type members struct {
	*group
	eps []*Endpoint
}

// admitted counts the endpoints whose source admits them.
func (g *members) admitted() int {
	n := 0
	for _, ep := range g.eps {
		if ep.Admitted() {
			n++
		}
	}
	return n
}

func (f *Fleet) view() *view { return f.v.Load() }

// member returns model's members in v, adding an empty group (v must not
// be published yet).
func (v *view) member(model string) *members {
	g := v.byModel[model]
	if g == nil {
		g = &members{group: &group{model: model}}
		v.byModel[model] = g
	}
	return g
}

// with returns a copy of v with ep added at the end of its models' lists.
// Groups are shared with v, so a model's panic state carries over.
func (v *view) with(ep *Endpoint) *view {
	out := &view{all: append(slices.Clone(v.all), ep), byModel: make(map[string]*members, len(v.byModel))}
	for m, g := range v.byModel {
		out.byModel[m] = g
	}
	for _, m := range ep.models {
		g := out.member(m)
		out.byModel[m] = &members{group: g.group, eps: append(slices.Clone(g.eps), ep)}
	}
	return out
}

// without returns a copy of v without ep. A model's group stays when its
// last endpoint goes: the model is still configured.
func (v *view) without(ep *Endpoint) *view {
	out := &view{all: slices.DeleteFunc(slices.Clone(v.all), func(e *Endpoint) bool { return e == ep }),
		byModel: make(map[string]*members, len(v.byModel))}
	for m, g := range v.byModel {
		if slices.Contains(ep.models, m) {
			g = &members{group: g.group, eps: slices.DeleteFunc(slices.Clone(g.eps), func(e *Endpoint) bool { return e == ep })}
		}
		out.byModel[m] = g
	}
	return out
}

// Add adds an endpoint while the fleet runs: it starts up and admitted,
// not yet probed (so not counted ready until a probe passes), and Run
// starts its probes, scrapes and model checks. Its name must be new.
func (f *Fleet) Add(ec EndpointConfig) (*Endpoint, error) {
	ep, err := f.newEndpoint(ec)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	v := f.view()
	for _, e := range v.all {
		if e.name == ep.name {
			return nil, fmt.Errorf("endpoint %q already exists", ep.name)
		}
	}
	nv := v.with(ep)
	for _, m := range ep.models {
		if v.byModel[m] == nil {
			f.m.panic.WithLabelValues(m).Set(0)
		}
	}
	f.m.initEndpoint(ep)
	f.v.Store(nv)
	f.poke()
	f.log.Info("endpoint added", "endpoint", ep.name, "url", ep.base)
	return ep, nil
}

// Remove takes the endpoint out of the fleet: it gets no new requests,
// Run stops its loops, and its metric series are deleted. Requests in
// flight on it finish; what they report about it is ignored. It reports
// whether the endpoint existed.
func (f *Fleet) Remove(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	v := f.view()
	i := slices.IndexFunc(v.all, func(e *Endpoint) bool { return e.name == name })
	if i < 0 {
		return false
	}
	ep := v.all[i]
	f.v.Store(v.without(ep))
	f.m.removeEndpoint(ep)
	for _, m := range ep.models {
		if g := f.view().byModel[m]; g != nil {
			f.refreshGroup(g)
		}
	}
	f.poke()
	f.log.Info("endpoint removed", "endpoint", ep.name, "url", ep.base)
	return true
}

// SetRoutable admits the endpoint to new requests (true) or not (false:
// its source says it is not ready, or terminating and finishing what it
// has). An endpoint not admitted keeps its health state and loops and
// counts in no model's panic share. Unknown names are ignored.
func (f *Fleet) SetRoutable(name string, ok bool) {
	ep := f.Endpoint(name)
	if ep == nil || ep.Admitted() == ok {
		return
	}
	ep.notAdmitted.Store(!ok)
	f.withMetrics(ep, func(m *metrics) {
		v := 0.0
		if ok {
			v = 1
		}
		m.admitted.WithLabelValues(ep.name).Set(v)
	})
	f.refreshPanic(ep)
}

// refreshGroup re-evaluates g's panic state (after a membership change).
func (f *Fleet) refreshGroup(g *members) {
	now := f.cfg.Now()
	up, soft := 0, 0
	for _, e := range g.eps {
		if !e.Admitted() {
			continue
		}
		u, s, _ := e.usable(now, f.cfg.ProbeInterval < 0)
		if u {
			up++
		} else if s {
			soft++
		}
	}
	f.setPanic(g, f.panicking(up, g.admitted()), up, soft)
}

// poke tells Run that the membership changed (merging bursts).
func (f *Fleet) poke() {
	select {
	case f.changed <- struct{}{}:
	default:
	}
}

// withMetrics runs set on the fleet's metrics unless ep was removed: a
// removed endpoint's series are deleted once and never come back from a
// late report or a probe that was under way.
func (f *Fleet) withMetrics(ep *Endpoint, set func(m *metrics)) {
	ep.metricsMu.Lock()
	defer ep.metricsMu.Unlock()
	if !ep.removed {
		set(f.m)
	}
}
