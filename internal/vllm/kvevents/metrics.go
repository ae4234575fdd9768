package kvevents

import (
	"errors"
	"kvrouter/internal/vllm"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// SubscriberMetrics holds the Prometheus collectors of every Subscriber of a
// process. Make one per registry with NewSubscriberMetrics and pass it to
// each NewSubscriber: the series are told apart by the "engine" label
// (SubscriberConfig.Engine) and, where useful, "rank" (data-parallel rank).
// A Subscriber deletes its label values when its Run returns. Safe for
// concurrent use.
type SubscriberMetrics struct {
	batches       *prometheus.CounterVec
	events        *prometheus.CounterVec
	blocksStored  *prometheus.CounterVec
	blocksRemoved *prometheus.CounterVec
	gaps          *prometheus.CounterVec
	replays       *prometheus.CounterVec
	replayErrors  *prometheus.CounterVec
	unrecoverable *prometheus.CounterVec
	restarts      *prometheus.CounterVec
	queueDrops    *prometheus.CounterVec
	malformed     *prometheus.CounterVec
	duplicates    *prometheus.CounterVec
	reconnects    *prometheus.CounterVec
	rejectedConns *prometheus.CounterVec
	idleChecks    *prometheus.CounterVec
	oversized     *prometheus.CounterVec
	recovered     *prometheus.CounterVec
	overflows     *prometheus.CounterVec
	connected     *prometheus.GaugeVec
	lag           *prometheus.HistogramVec
}

// NewSubscriberMetrics creates the collectors and registers them with reg
// (nil: not registered, for tests and tools that export nothing). It fails
// when reg already holds collectors of these names, e.g. on a second call
// with the same registry. Metric names (all with labels engine, rank):
//
//	kvrouter_vllm_batches_total            batches handed to the consumer (live or replayed, each seq once; heartbeats included)
//	kvrouter_vllm_events_total             events in those batches, also by label type
//	kvrouter_vllm_blocks_stored_total      block hashes in BlockStored events
//	kvrouter_vllm_blocks_removed_total     block hashes in BlockRemoved events
//	kvrouter_vllm_gaps_total               live seq jumps past the next expected seq
//	kvrouter_vllm_replays_total            replay requests sent
//	kvrouter_vllm_replay_errors_total      replay requests that failed or timed out
//	kvrouter_vllm_unrecoverable_gaps_total gaps nothing could fill, and reconnections that could not be checked (consumer told to drop state)
//	kvrouter_vllm_restarts_total           engine restarts: live seq went backwards, or found by replay on reconnection
//	kvrouter_vllm_queue_drops_total        batches that found the consumer queue full (each seq once; caught up by replay or lost)
//	kvrouter_vllm_queue_recovered_total    of those, batches handed on later by replay
//	kvrouter_vllm_overflow_resets_total    full-queue episodes replay could not cover (consumer told to drop state: ResetOverflow)
//	kvrouter_vllm_malformed_total          messages or payloads that could not be decoded
//	kvrouter_vllm_duplicates_total         live batches skipped because replay delivered them
//	kvrouter_vllm_reconnects_total         connections to the engine lost and re-established
//	kvrouter_vllm_rejected_conns_total     bind mode: engine connections closed at accept because the rank had max_conns open
//	kvrouter_vllm_idle_checks_total        idle checks: replay asked for batches after the last applied one (counted in replays_total only when they delivered)
//	kvrouter_vllm_oversized_messages_total connections closed because a message exceeded max_message_bytes (events, replay or bound port)
//	kvrouter_vllm_connected                1 while a live connection is up
//	kvrouter_vllm_lag_seconds              histogram of now - batch ts for live batches
func NewSubscriberMetrics(reg prometheus.Registerer) (*SubscriberMetrics, error) {
	er := []string{"engine", "rank"}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_vllm_" + name, Help: help,
		}, append(append([]string{}, er...), labels...))
	}
	m := &SubscriberMetrics{
		batches:       counter("batches_total", "KV event batches handed to the consumer (each seq once, live or replayed)."),
		events:        counter("events_total", "KV events handed to the consumer.", "type"),
		blocksStored:  counter("blocks_stored_total", "Block hashes in BlockStored events handed to the consumer."),
		blocksRemoved: counter("blocks_removed_total", "Block hashes in BlockRemoved events handed to the consumer."),
		gaps:          counter("gaps_total", "Live sequence numbers that skipped past the next expected one."),
		replays:       counter("replays_total", "Replay requests sent to the engine's replay endpoint."),
		replayErrors:  counter("replay_errors_total", "Replay requests that failed or timed out."),
		unrecoverable: counter("unrecoverable_gaps_total", "Gaps that could not be filled, and reconnections that could not be checked; the consumer was told to drop this engine rank's state."),
		restarts:      counter("restarts_total", "Engine restarts detected (live sequence number went backwards, or found by replay on reconnection)."),
		queueDrops:    counter("queue_drops_total", "Batches that found the consumer queue full (each seq once); caught up by replay, or lost in an overflow reset."),
		recovered:     counter("queue_recovered_total", "Batches that found the consumer queue full and were handed on later by replay."),
		overflows:     counter("overflow_resets_total", "Full consumer queues that replay could not cover (no replay endpoint, replay failed, or the engine no longer buffered the batches); the consumer was told to drop this engine rank's state."),
		malformed:     counter("malformed_total", "Messages or payloads that could not be decoded."),
		duplicates:    counter("duplicates_total", "Live batches skipped because a replay had already delivered them."),
		reconnects:    counter("reconnects_total", "Connections to the engine lost and re-established."),
		rejectedConns: counter("rejected_conns_total", "Bind mode: engine connections closed at accept because the rank already had max_conns open."),
		idleChecks:    counter("idle_checks_total", "Idle checks: the replay endpoint asked for batches after the last applied one, after idle_check without live events."),
		oversized:     counter("oversized_messages_total", "Connections closed because a ZMTP message exceeded max_message_bytes (live, replay or bound port)."),
		connected: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvrouter_vllm_connected", Help: "1 while the live event connection to the engine rank is up.",
		}, er),
		lag: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvrouter_vllm_lag_seconds",
			Help:    "Receive time minus the batch timestamp of live KV event batches.",
			Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
		}, er),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range m.collectors() {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *SubscriberMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.batches, m.events, m.blocksStored, m.blocksRemoved, m.gaps,
		m.replays, m.replayErrors, m.unrecoverable, m.restarts, m.queueDrops, m.malformed,
		m.duplicates, m.reconnects, m.rejectedConns, m.idleChecks, m.oversized, m.recovered, m.overflows, m.connected, m.lag}
}

// deleteEngine removes every series of one engine.
func (m *SubscriberMetrics) deleteEngine(engine string) {
	l := prometheus.Labels{"engine": engine}
	m.batches.DeletePartialMatch(l)
	m.events.DeletePartialMatch(l)
	m.blocksStored.DeletePartialMatch(l)
	m.blocksRemoved.DeletePartialMatch(l)
	m.gaps.DeletePartialMatch(l)
	m.replays.DeletePartialMatch(l)
	m.replayErrors.DeletePartialMatch(l)
	m.unrecoverable.DeletePartialMatch(l)
	m.restarts.DeletePartialMatch(l)
	m.queueDrops.DeletePartialMatch(l)
	m.malformed.DeletePartialMatch(l)
	m.duplicates.DeletePartialMatch(l)
	m.reconnects.DeletePartialMatch(l)
	m.rejectedConns.DeletePartialMatch(l)
	m.idleChecks.DeletePartialMatch(l)
	m.oversized.DeletePartialMatch(l)
	m.recovered.DeletePartialMatch(l)
	m.overflows.DeletePartialMatch(l)
	m.connected.DeletePartialMatch(l)
	m.lag.DeletePartialMatch(l)
}

// rankMetrics are one (engine, rank)'s children, resolved once.
type rankMetrics struct {
	batches, blocksStored, blocksRemoved, gaps, replays, replayErrors,
	unrecoverable, restarts, queueDrops, malformed, duplicates, reconnects, rejectedConns, idleChecks,
	queueRecovered, overflowResets, oversized prometheus.Counter
	stored, removed, cleared prometheus.Counter // events by type
	connected                prometheus.Gauge
	lag                      prometheus.Observer
}

func (m *SubscriberMetrics) forRank(engine string, rank int) *rankMetrics {
	r := strconv.Itoa(rank)
	return &rankMetrics{
		batches:        m.batches.WithLabelValues(engine, r),
		blocksStored:   m.blocksStored.WithLabelValues(engine, r),
		blocksRemoved:  m.blocksRemoved.WithLabelValues(engine, r),
		gaps:           m.gaps.WithLabelValues(engine, r),
		replays:        m.replays.WithLabelValues(engine, r),
		replayErrors:   m.replayErrors.WithLabelValues(engine, r),
		unrecoverable:  m.unrecoverable.WithLabelValues(engine, r),
		restarts:       m.restarts.WithLabelValues(engine, r),
		queueDrops:     m.queueDrops.WithLabelValues(engine, r),
		malformed:      m.malformed.WithLabelValues(engine, r),
		duplicates:     m.duplicates.WithLabelValues(engine, r),
		reconnects:     m.reconnects.WithLabelValues(engine, r),
		rejectedConns:  m.rejectedConns.WithLabelValues(engine, r),
		idleChecks:     m.idleChecks.WithLabelValues(engine, r),
		oversized:      m.oversized.WithLabelValues(engine, r),
		queueRecovered: m.recovered.WithLabelValues(engine, r),
		overflowResets: m.overflows.WithLabelValues(engine, r),
		stored:         m.events.WithLabelValues(engine, r, vllm.BlockStored.String()),
		removed:        m.events.WithLabelValues(engine, r, vllm.BlockRemoved.String()),
		cleared:        m.events.WithLabelValues(engine, r, vllm.AllBlocksCleared.String()),
		connected:      m.connected.WithLabelValues(engine, r),
		lag:            m.lag.WithLabelValues(engine, r),
	}
}
