package fleet

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the fleet's collectors, registered by newMetrics.
type metrics struct {
	up        *prometheus.GaugeVec
	ejections *prometheus.CounterVec
	probes    *prometheus.CounterVec
	scrapes   *prometheus.CounterVec
	restarts  *prometheus.CounterVec
	panic     *prometheus.GaugeVec
	notServed *prometheus.GaugeVec
	admitted  *prometheus.GaugeVec
}

// initEndpoint creates an endpoint's counters at 0, for every label value
// they take, so that they exist before their first event (an alert on a
// rate sees 0, not "no data").
func (m *metrics) initEndpoint(ep *Endpoint) {
	name := ep.name
	m.up.WithLabelValues(name).Set(1)
	m.admitted.WithLabelValues(name).Set(1)
	for _, model := range ep.models {
		m.notServed.WithLabelValues(name, model).Set(0)
	}
	for _, o := range []Outcome{OutcomeConnError, OutcomeTimeout, OutcomeServerError, OutcomeBackpressure} {
		m.ejections.WithLabelValues(name, o.String())
	}
	m.ejections.WithLabelValues(name, "probe")
	m.ejections.WithLabelValues(name, "probe_timeout")
	m.ejections.WithLabelValues(name, "stall")
	for _, r := range []string{"ok", "error", "timeout"} {
		m.probes.WithLabelValues(name, r)
	}
	for _, r := range []string{"ok", "error"} {
		m.scrapes.WithLabelValues(name, r)
	}
	m.restarts.WithLabelValues(name)
}

// removeEndpoint deletes every series of ep, for good (see withMetrics).
func (m *metrics) removeEndpoint(ep *Endpoint) {
	ep.metricsMu.Lock()
	defer ep.metricsMu.Unlock()
	ep.removed = true
	l := prometheus.Labels{"endpoint": ep.name}
	m.up.DeletePartialMatch(l)
	m.admitted.DeletePartialMatch(l)
	m.ejections.DeletePartialMatch(l)
	m.probes.DeletePartialMatch(l)
	m.scrapes.DeletePartialMatch(l)
	m.restarts.DeletePartialMatch(l)
	m.notServed.DeletePartialMatch(l)
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		up: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvrouter_fleet_endpoint_up",
			Help: "1 when the endpoint may receive traffic, 0 when it is ejected.",
		}, []string{"endpoint"}),
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_fleet_ejections_total",
			Help: "Endpoints taken down, by reason (conn_error, timeout, server_error, backpressure, probe, probe_timeout, stall: a request overdue while it showed no progress).",
		}, []string{"endpoint", "reason"}),
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_fleet_probes_total",
			Help: "GET /health probes by result (ok, timeout, error).",
		}, []string{"endpoint", "result"}),
		scrapes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_fleet_scrapes_total",
			Help: "GET /metrics scrapes by result (ok, error).",
		}, []string{"endpoint", "result"}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_fleet_engine_restarts_total",
			Help: "Engine restarts seen in /metrics scrapes (a vllm: counter such as prefix_cache_queries_total went backwards).",
		}, []string{"endpoint"}),
		panic: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvrouter_fleet_panic_mode",
			Help: "1 while fewer than the panic threshold of the model's endpoints are up: endpoints down for timeouts alone are routed too.",
		}, []string{"model"}),
		notServed: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvrouter_fleet_model_not_served",
			Help: "1 when the endpoint's last GET /v1/models lacks the configured model name (the engine would answer 404); 0 otherwise or before a listing.",
		}, []string{"endpoint", "model"}),
		admitted: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvrouter_fleet_endpoint_admitted",
			Help: "1 when the endpoint's source (Kubernetes discovery: ready; router.yaml: listed) admits it to new requests, 0 while it is not ready or terminating.",
		}, []string{"endpoint"}),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.up, m.ejections, m.probes, m.scrapes, m.restarts, m.panic, m.notServed, m.admitted} {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	return m, errors.Join(errs...)
}
