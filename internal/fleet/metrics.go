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
}

// initEndpoint creates an endpoint's counters at 0, for every label value
// they take, so that they exist before their first event (an alert on a
// rate sees 0, not "no data").
func (m *metrics) initEndpoint(name string) {
	for _, o := range []Outcome{OutcomeConnError, OutcomeServerError, OutcomeBackpressure} {
		m.ejections.WithLabelValues(name, o.String())
	}
	m.ejections.WithLabelValues(name, "probe")
	for _, r := range []string{"ok", "error"} {
		m.probes.WithLabelValues(name, r)
		m.scrapes.WithLabelValues(name, r)
	}
	m.restarts.WithLabelValues(name)
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		up: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvrouter_fleet_endpoint_up",
			Help: "1 when the endpoint may receive traffic, 0 when it is ejected.",
		}, []string{"endpoint"}),
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_fleet_ejections_total",
			Help: "Endpoints taken down, by reason (conn_error, server_error, backpressure, probe).",
		}, []string{"endpoint", "reason"}),
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_fleet_probes_total",
			Help: "GET /health probes by result (ok, error).",
		}, []string{"endpoint", "result"}),
		scrapes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_fleet_scrapes_total",
			Help: "GET /metrics scrapes by result (ok, error).",
		}, []string{"endpoint", "result"}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_fleet_engine_restarts_total",
			Help: "Engine restarts seen in /metrics scrapes (a vllm: counter such as prefix_cache_queries_total went backwards).",
		}, []string{"endpoint"}),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.up, m.ejections, m.probes, m.scrapes, m.restarts} {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	return m, errors.Join(errs...)
}
