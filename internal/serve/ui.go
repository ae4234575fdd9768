package serve

import (
	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/config"
	"kvrouter/internal/fleet"
	"kvrouter/internal/group"
	"kvrouter/internal/proxy"
	"kvrouter/internal/ui"
)

// newUI builds the /ui page over the fleet and the router's registry and
// hooks it into deps: the page's handler and the decisions it lists.
func newUI(cfg config.Config, flt *fleet.Fleet, reg prometheus.Gatherer, deps *proxy.Deps) *ui.UI {
	policies := map[string]string{}
	for _, m := range cfg.Models {
		policies[m.Name] = m.Policy
	}
	page := ui.New(ui.Config{APIKey: cfg.APIKey, Policies: policies}, ui.Deps{Fleet: flt, Gatherer: reg})
	deps.UI = page.Handler()
	deps.OnDecision = func(model, id string, prompt int, d group.Decision) {
		page.Record(model, id, d.Replica, d.CachedTokens, prompt, d.Explain)
	}
	return page
}
