package proxy

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// featureMetrics are the series of adapters and route aliases.
type featureMetrics struct {
	adapterLoads *prometheus.CounterVec
}

func newFeatureMetrics(reg prometheus.Registerer) (*featureMetrics, error) {
	m := &featureMetrics{
		adapterLoads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_proxy_adapter_loads_total",
			Help: "LoRA adapters loaded by kvrouter at run time (POST /v1/load_lora_adapter), by model group, engine and result (ok, error).",
		}, []string{"model", "engine", "result"}),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.adapterLoads} {
		errs = append(errs, reg.Register(c))
	}
	return m, errors.Join(errs...)
}
