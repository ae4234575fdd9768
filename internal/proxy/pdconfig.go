package proxy

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/config"
	"kvrouter/internal/fleet"
	"kvrouter/internal/pd"
)

// Paths a request of a P/D group takes (x-kvrouter-path, the path label of
// kvrouter_proxy_pd_requests_total).
const (
	// pathDisaggregated: prefill leg on a prefill engine, KV moved, decode
	// leg on a decode engine.
	pathDisaggregated = "disaggregated"
	// pathLocal: the decode engine prefills the prompt itself (conditional
	// disaggregation's bypass, mode never, or no prefill engine up).
	pathLocal = "local"
	// pathWhole: the whole request (prefill and decode, no
	// kv_transfer_params) on a prefill engine (pd.ReasonWhole).
	pathWhole = "whole"
)

// reasonNoPrefill is the reason of a local path taken because no prefill
// engine is up; reasonPromptUnknown of a remote one taken without token
// ids (the uncached part cannot be measured).
const (
	reasonNoPrefill     = "no_prefill_engine"
	reasonPromptUnknown = "prompt_unknown"
	// reasonParallelSampling: n or best_of above 1, always local
	// (parallelSampling).
	reasonParallelSampling = "parallel_sampling"
)

// pdGroup is one model group's disaggregated serving: the rule and each
// engine's role. The rule is read-only after New; the roles of a
// discovered group change with its Pods' role labels (SetRoles).
type pdGroup struct {
	rule pd.Rule
	// roles maps engine names to config.RolePrefill or config.RoleDecode; replaced
	// whole, never changed in place.
	roles atomic.Pointer[map[string]string]
	// discovered: the roles come from SetRoles, and the group is served
	// aggregated while it has no prefill engine.
	discovered bool
}

// newPDGroup returns mc's P/D set-up, nil when no engine has a role and
// the group is not discovered with a role label. mc is validated
// (validatePD).
func newPDGroup(mc config.Model) *pdGroup {
	g := &pdGroup{}
	roles := map[string]string{}
	for _, e := range mc.Engines {
		if e.Role != "" {
			roles[e.FleetName()] = e.Role
		}
	}
	g.discovered = mc.Discovery != nil && mc.Discovery.RoleLabel != config.RoleLabelOff
	if len(roles) == 0 && !g.discovered {
		return nil
	}
	g.roles.Store(&roles)
	g.rule, _ = mc.PD.WithDefaults()
	return g
}

func (g *pdGroup) role(name string) string { return (*g.roles.Load())[name] }

func (g *pdGroup) isPrefill(name string) bool { return g.role(name) == config.RolePrefill }
func (g *pdGroup) isDecode(name string) bool  { return g.role(name) == config.RoleDecode }

// active reports whether the group is served in P/D (pd.go): always for
// roles from router.yaml; for a discovered group, while one of its
// engines is a prefill engine (else it serves whole requests, as a group
// without roles).
func (g *pdGroup) active() bool {
	if !g.discovered {
		return true
	}
	for _, r := range *g.roles.Load() {
		if r == config.RolePrefill {
			return true
		}
	}
	return false
}

// SetRoles replaces the roles of model's discovered engines (engine name
// -> config.RolePrefill or config.RoleDecode, discovery.Engine.Role): engines move
// between the prefill and decode pools from the next request on. It
// reports false, changing nothing, for a model that is not a discovered
// group with roles.
func (s *Server) SetRoles(model string, roles map[string]string) bool {
	m, ok := s.models[model]
	if !ok || m.pd == nil || !m.pd.discovered {
		return false
	}
	cp := make(map[string]string, len(roles))
	for n, r := range roles {
		if r == config.RolePrefill || r == config.RoleDecode {
			cp[n] = r
		}
	}
	m.pd.roles.Store(&cp)
	return true
}

// split returns the names of the prefill and decode engines among eps.
func (g *pdGroup) split(eps []*fleet.Endpoint) (prefill, decode []string) {
	roles := *g.roles.Load()
	for _, ep := range eps {
		switch roles[ep.Name()] {
		case config.RolePrefill:
			prefill = append(prefill, ep.Name())
		case config.RoleDecode:
			decode = append(decode, ep.Name())
		}
	}
	return prefill, decode
}

// pdMetrics are the disaggregated-serving metrics.
type pdMetrics struct {
	requests        *prometheus.CounterVec
	prefillSeconds  *prometheus.HistogramVec
	prefillFailures *prometheus.CounterVec
}

func newPDMetrics(reg prometheus.Registerer) (*pdMetrics, error) {
	if reg == nil {
		reg = prometheus.NewRegistry() // unexported: nothing reads it
	}
	m := &pdMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvrouter_proxy_pd_requests_total",
			Help: "Requests of P/D model groups by path (disaggregated, local, whole) and the rule's reason."}, []string{"model", "path", "reason"}),
		prefillSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvrouter_proxy_pd_prefill_seconds",
			Help:    "Duration of successful prefill legs, from sending to the whole answer, in seconds.",
			Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}}, []string{"model"}),
		prefillFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvrouter_proxy_pd_prefill_failures_total",
			Help: "Prefill legs that failed, by cause (status, conn_error, timeout, no_transfer_params, client_closed); no decode leg is sent after one."}, []string{"model", "cause"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.prefillSeconds, m.prefillFailures} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// initModel creates a P/D group's series at 0, so that alerts see 0, not
// "no data": both paths with their usual reasons, every failure cause.
func (m *pdMetrics) initModel(model string) {
	m.requests.WithLabelValues(model, pathDisaggregated, pd.ReasonRemote)
	m.requests.WithLabelValues(model, pathLocal, pd.ReasonShort)
	m.requests.WithLabelValues(model, pathLocal, pd.ReasonPrefillBusy)
	m.requests.WithLabelValues(model, pathWhole, pd.ReasonWhole)
	m.prefillSeconds.WithLabelValues(model)
	for _, c := range []string{"status", "conn_error", "timeout", "no_transfer_params", "client_closed"} {
		m.prefillFailures.WithLabelValues(model, c)
	}
}
