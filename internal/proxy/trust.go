package proxy

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/group"
)

// Index trust (group.Trust decides; this file keeps its metrics and reads
// the answers). Every answer that reports
// usage.prompt_tokens_details.cached_tokens (vLLM with
// --enable-prompt-tokens-details; every non-streaming answer, and streams
// whose client asked for stream_options.include_usage) is compared with
// what the index said the chosen engine holds
// (group.Decision.IndexCachedTokens).

// trust keeps each engine's streaks and trust (group.Trust) and their
// series; safe for concurrent use.
type trust struct {
	log     *slog.Logger
	present func(replica string) bool // the fleet still has the engine
	errs    *prometheus.HistogramVec
	out     *prometheus.GaugeVec
	changes *prometheus.CounterVec

	mu    sync.Mutex
	state group.Trust // under mu
}

func newTrust(log *slog.Logger, reg prometheus.Registerer, present func(string) bool) (*trust, error) {
	t := &trust{log: log, present: present,
		errs: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvrouter_proxy_cached_prediction_error_tokens",
			Help:    "Per answer that reported usage.prompt_tokens_details.cached_tokens: the prefix-cache hit the index predicted on the engine minus the hit the engine reported, in tokens (positive: the index promised more than the engine had).",
			Buckets: []float64{-16384, -4096, -1024, -256, -64, -16, 0, 16, 64, 256, 1024, 4096, 16384},
		}, []string{"replica"}),
		out: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvrouter_proxy_index_distrusted",
			Help: "1 while the engine's index entries are ignored (routed by load alone) because its reported cached tokens kept falling short of the index's prediction.",
		}, []string{"replica"}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_proxy_index_distrusts_total",
			Help: "Times the engine's index entries stopped being trusted (reported cached tokens fell short of the prediction in 3 answers in a row).",
		}, []string{"replica"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{t.errs, t.out, t.changes} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return t, nil
}

// observe records one answer of replica (model group r) whose index
// prediction was predicted tokens and whose engine reported reported.
func (t *trust) observe(r group.Router, model, replica string, predicted, reported int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.present(replica) {
		return // removed while the request ran: its series are gone
	}
	t.errs.WithLabelValues(replica).Observe(float64(predicted - reported))
	it, _ := r.(group.IndexTruster)
	switch change, streak := t.state.Observe(it, replica, predicted, reported); change {
	case group.TrustLost:
		t.out.WithLabelValues(replica).Set(1)
		t.changes.WithLabelValues(replica).Inc()
		t.log.Warn("engine reports fewer cached tokens than its KV events promise; routing it by load alone until they agree",
			"model", model, "replica", replica, "predicted_cached_tokens", predicted, "reported_cached_tokens", reported, "misses_in_a_row", streak)
	case group.TrustRegained:
		t.out.WithLabelValues(replica).Set(0)
		t.log.Info("engine's reported cached tokens agree with its KV events again; its index entries are trusted",
			"model", model, "replica", replica, "agreeing_in_a_row", streak)
	}
}

// init creates replica's series at 0 (an engine present at start, or
// added while serving).
func (t *trust) init(replica string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.errs.WithLabelValues(replica)
	t.out.WithLabelValues(replica).Set(0)
	t.changes.WithLabelValues(replica)
}

// forget deletes replica's state and series (the engine left the fleet).
func (t *trust) forget(replica string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.state.Forget(replica)
	l := prometheus.Labels{"replica": replica}
	t.errs.DeletePartialMatch(l)
	t.out.DeletePartialMatch(l)
	t.changes.DeletePartialMatch(l)
}

// hitReport is what an answer's usage said about the prefix-cache hit.
type hitReport struct {
	seen   bool // some usage carried prompt_tokens_details
	cached int
}

var (
	detailsKey = []byte(`"prompt_tokens_details"`)
	// detailsProbe finds detailsKey's candidates: its first byte, rare in
	// streamed chunks (unlike a quote), keeps the scan of an event without
	// usage at a few ns.
	detailsProbe = []byte(`_tokens_details"`)
)

// note reads the usage of b: a JSON answer, or whole events of a stream
// (each "data:" line that carries prompt_tokens_details). Cheap when b has
// no usage details (one bytes.Contains for a needle whose first byte is
// rare).
func (h *hitReport) note(b []byte, sse bool) {
	if !bytes.Contains(b, detailsProbe) || !bytes.Contains(b, detailsKey) {
		return
	}
	if !sse {
		h.parse(b)
		return
	}
	for line := range bytes.Lines(b) {
		if d, ok := bytes.CutPrefix(line, dataField); ok && bytes.Contains(d, detailsKey) {
			h.parse(d)
		}
	}
}

func (h *hitReport) parse(b []byte) {
	var v struct {
		Usage *struct {
			Details *struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if json.Unmarshal(b, &v) != nil || v.Usage == nil || v.Usage.Details == nil {
		return
	}
	h.seen, h.cached = true, v.Usage.Details.Cached
}

// capBuffer keeps the first max bytes written to it (a non-streaming
// answer, for its usage); longer answers are not read for usage.
type capBuffer struct {
	b    []byte
	max  int
	over bool
}

func (c *capBuffer) Write(p []byte) (int, error) {
	if !c.over && len(c.b)+len(p) <= c.max {
		c.b = append(c.b, p...)
	} else {
		c.over, c.b = true, nil
	}
	return len(p), nil
}

// maxUsageBody bounds the non-streaming answer kept to read its usage.
const maxUsageBody = 1 << 20
