package proxy

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Index trust. The exact index believes what an engine's KV events say,
// and anyone who can publish on (or connect to) an event port can say
// anything: a forged BlockStored for a prompt the engine never saw makes it
// the cheapest replica for that prompt. Every answer that reports
// usage.prompt_tokens_details.cached_tokens (vLLM with
// --enable-prompt-tokens-details; every non-streaming answer, and streams
// whose client asked for stream_options.include_usage) is compared with
// what the index said the chosen engine holds (routing.Decision.IndexBlocks
// in tokens, as the engine would count them: engineHit). An answer is a
// miss when the engine reported less than half the predicted hit (and at
// least 16 tokens less); trustMisses misses in a row, with no agreeing
// answer in between, make the router stop trusting that engine's index
// entries (routing.Router.SetIndexTrusted: it competes by load alone) until
// trustAgrees answers in a row agree again. Answers for which the index
// predicted nothing say nothing either way. This also catches index drift
// of any other cause (lost events the sequence checks missed, a block hash
// mismatch).

// Streaks that change an engine's trust.
const (
	trustMisses = 3
	trustAgrees = 3
	// missSlack is the over-prediction, in tokens, below which an answer
	// is never a miss (a block of 16 tokens evicted between the lookup and
	// the engine's schedule).
	missSlack = 16
)

// indexTruster is a Router whose index trust can be switched per engine
// (Backend).
type indexTruster interface {
	SetIndexTrusted(replica string, ok bool)
}

// trust keeps each engine's streaks and trust; safe for concurrent use.
type trust struct {
	log     *slog.Logger
	present func(replica string) bool // the fleet still has the engine
	errs    *prometheus.HistogramVec
	out     *prometheus.GaugeVec
	changes *prometheus.CounterVec

	mu   sync.Mutex
	reps map[string]*trustState
}

type trustState struct {
	misses, agrees int
	distrusted     bool
}

func newTrust(log *slog.Logger, reg prometheus.Registerer, present func(string) bool) (*trust, error) {
	t := &trust{log: log, present: present, reps: map[string]*trustState{},
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
func (t *trust) observe(r Router, model, replica string, predicted, reported int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.present(replica) {
		return // removed while the request ran: its series are gone
	}
	t.errs.WithLabelValues(replica).Observe(float64(predicted - reported))
	if predicted == 0 {
		return
	}
	st := t.reps[replica]
	if st == nil {
		st = &trustState{}
		t.reps[replica] = st
	}
	miss := predicted-reported >= missSlack && reported < predicted/2
	if miss {
		st.misses, st.agrees = st.misses+1, 0
	} else {
		st.misses, st.agrees = 0, st.agrees+1
	}
	it, ok := r.(indexTruster)
	switch {
	case !ok:
	case !st.distrusted && st.misses >= trustMisses:
		st.distrusted = true
		it.SetIndexTrusted(replica, false)
		t.out.WithLabelValues(replica).Set(1)
		t.changes.WithLabelValues(replica).Inc()
		t.log.Warn("engine reports fewer cached tokens than its KV events promise; routing it by load alone until they agree",
			"model", model, "replica", replica, "predicted_cached_tokens", predicted, "reported_cached_tokens", reported, "misses_in_a_row", st.misses)
	case st.distrusted && st.agrees >= trustAgrees:
		st.distrusted = false
		it.SetIndexTrusted(replica, true)
		t.out.WithLabelValues(replica).Set(0)
		t.log.Info("engine's reported cached tokens agree with its KV events again; its index entries are trusted",
			"model", model, "replica", replica, "agreeing_in_a_row", st.agrees)
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
	delete(t.reps, replica)
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
