package serve

import (
	"context"
	"net"

	"golang.org/x/sync/errgroup"

	"kvrouter/internal/admission"
	"kvrouter/internal/epp"
)

// RunEPP runs the app as Run does, with HTTP on ln, and beside it an
// ext_proc endpoint picker (internal/epp, configured by cfg) on gln, until
// ctx ends. It owns both listeners; on an error before serving it closes
// them and releases the app.
func (a *App) RunEPP(ctx context.Context, cfg epp.Config, ln, gln net.Listener) error {
	var models, replicas []string
	for _, m := range a.cfg.Models {
		models = append(models, m.Name)
		for _, ep := range a.flt.Endpoints(m.Name) {
			replicas = append(replicas, ep.Name())
		}
	}
	picker := a.srv.Picker()
	srv, err := epp.New(cfg, epp.Deps{Picker: picker, Models: models, Replicas: replicas, Ready: func() bool { return a.eppReady(picker) }}, a.log, a.reg)
	if err != nil {
		ln.Close()
		gln.Close()
		a.Close()
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(recovered("router", func() error { return a.Run(gctx, ln) }))
	g.Go(recovered("epp", func() error { return srv.Run(gctx, gln) }))
	return g.Wait()
}

// eppReady is the EPP's readiness: what GET /ready says (every model has
// an engine up and probed, which for a discovered group means its source
// has synced and listed one), and for each model on the event-fed index an
// engine of it with its KV event stream connected, as its subscriber
// reports (kvevents.Subscriber.Connected).
func (a *App) eppReady(p *admission.Picker) bool {
	if !p.Ready() {
		return false
	}
	conn := connectedEngines(a.groups)
	for model, exact := range a.exact {
		if !exact {
			continue
		}
		ok := false
		for _, ep := range a.flt.Endpoints(model) {
			ok = ok || conn[ep.Name()]
		}
		if !ok {
			return false
		}
	}
	return true
}
