package tokenizer

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics holds the package's collectors. One registry may hold several
// Remotes and Probes (one per engine); they share the collectors registered
// first.
type metrics struct {
	// renderSeconds: kvrouter_tokenizer_render_seconds{endpoint, outcome},
	// the wall time of each call to the engine (endpoint: chat_render,
	// completion_render, tokenize; outcome: ok, error, timeout, canceled,
	// unavailable).
	renderSeconds *prometheus.HistogramVec
	// mismatch: kvrouter_tokenizer_mismatch{engine}, 1 while the last probe
	// of that engine found different ids, 0 when they agreed.
	mismatch *prometheus.GaugeVec
}

// newMetrics creates the collectors and registers them with reg (nil: not
// registered). Collectors already registered by another Remote or Probe
// on the same registry are reused.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		renderSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvrouter_tokenizer_render_seconds",
			Help:    "Time to get a prompt's token ids from an engine, by endpoint and outcome.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"endpoint", "outcome"}),
		mismatch: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvrouter_tokenizer_mismatch",
			Help: "1 when the last probe found the local tokenizer disagreeing with the engine's /tokenize, else 0.",
		}, []string{"engine"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	if m.renderSeconds, err = register(reg, m.renderSeconds); err != nil {
		return nil, err
	}
	if m.mismatch, err = register(reg, m.mismatch); err != nil {
		return nil, err
	}
	return m, nil
}

// register registers c, or returns the identical collector registered
// before it.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, fmt.Errorf("register tokenizer metrics: %w", err)
}
