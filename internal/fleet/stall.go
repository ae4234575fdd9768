package fleet

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"kvrouter/internal/vllm/enginemetrics"
)

// Stall detection. An engine can stop doing work while refusing nothing:
// a stopped process (SIGSTOP, a wedged host, a partition that drops
// packets) accepts connections and answers no byte; and a vLLM engine
// whose core is hung (a stuck GPU kernel or NCCL collective) keeps its API
// server answering: /health is 200 until the core process is dead
// (AsyncLLM.check_health raises only when errored, vllm/v1/engine/
// async_llm.py; the route is in vllm/entrypoints/openai/api_server.py, in
// newer versions vllm/entrypoints/serve/instrumentator/health.py),
// /metrics answers with its gauges and counters frozen (they
// are set only from the core's outputs: PrometheusStatLogger.record in
// vllm/v1/metrics/loggers.py, called by AsyncLLM's output_handler), and a
// streamed request gets its response headers at once (Starlette's
// StreamingResponse, before the first output) but no body byte (the first
// SSE chunk, the chat role included, is sent with the first output:
// serving_chat.py's chat_completion_stream_generator). Requests routed there
// wait, /health probes eject nothing, and every new request waits too.
//
// The proxy reports when it sends a request and the time it expects to
// wait for the first byte (Endpoint.Await: the routing model's predicted
// time to first token), and every sign of life (Endpoint.Heard). Signs of
// life are:
//   - body bytes of any 2xx answer (response headers are not: vLLM's API
//     server sends them before the core works; nor are error answers, nor
//     a Responses stream's opening events, response.created and
//     response.in_progress, sent before the first output too);
//   - a /metrics scrape that shows progress: vllm:prompt_tokens_total,
//     vllm:generation_tokens_total, vllm:prefix_cache_queries_total,
//     vllm:num_requests_running or vllm:num_requests_waiting changed since
//     the previous scrape; or, while no request waits on the engine, one
//     that reports no work (nothing running or waiting). An engine whose
//     /metrics lacks the two token counters (not vLLM) keeps the old rule:
//     every answered scrape is a sign of life;
//   - an answered /health probe, only while no request waits on the engine
//     and only on an engine that does not expose the token counters (an
//     API server answers /health for a hung core; a vLLM engine shows it
//     is back through its counters or by reporting no work).
//
// A request is overdue once it has waited max(StallAfter, stallFactor ×
// its predicted time to first token) for its first body byte: a single
// 100K-token prefill at 20K tokens/s (5 s without a byte or a counter
// change: vLLM counts a prompt's tokens when its prefill ends,
// IterationStats.update_from_output) is not a stall before 10 s. An
// engine is stalled when a request is overdue and the engine showed no
// sign of life since that request was sent, for at least the stall window
// (StallAfter, and at least 1.5 scrape intervals, so that a scrape, which
// comes every interval ±10%, falls inside it and a live engine's moving
// counters can show). A stalled engine takes no new requests (it counts as
// down for timeouts: panic mode may still route it) until its next sign of
// life; since a hung vLLM engine still answers /health, only a body byte
// or its counters moving (or reporting no work once no request waits on
// it) let it back.

// stallFactor multiplies a request's predicted time to first token to
// give its deadline (with StallAfter as the floor): room for a prediction
// that is off by up to 2x (a learned rate, another router's queue).
const stallFactor = 2

// Counter availability on an engine's /metrics (stallState.counters).
const (
	countersUnknown int32 = iota // not scraped yet, or scraping is off
	countersPresent              // vLLM's token counters are there
	countersAbsent               // scraped, without them: not vLLM
)

// stallState is an Endpoint's stall bookkeeping.
type stallState struct {
	heard    atomic.Int64 // unix ns of the last sign of life (0: none yet)
	stalled  atomic.Bool
	counters atomic.Int32 // countersUnknown, countersPresent, countersAbsent

	mu      sync.Mutex
	waits   map[uint64]wait // request -> its wait, until its answer starts
	next    uint64
	stallAt int64    // unix ns the stall was declared
	last    progress // the previous scrape's figures (when seen)
	seen    bool     // last holds a scrape
}

// wait is one request waiting for its first body byte.
type wait struct {
	sent int64 // unix ns it was sent
	due  int64 // unix ns it is overdue
}

// progress is what a scrape shows of the engine's work; a change means
// its core produced output since the previous scrape.
type progress struct {
	prompt, generation, queries, running, waiting float64
}

// Await records a request sent to the engine at now that has had no
// answer yet; ttft is the predicted time to its first token (0 when
// unknown). It counts as overdue after max(StallAfter, 2 × ttft). Call the
// returned function when the first body byte arrives, when the engine
// answers with an error status, and in any case when the request ends;
// calls after the first do nothing. Safe for concurrent use.
func (e *Endpoint) Await(now time.Time, ttft time.Duration) (answered func()) {
	s := &e.stall
	s.mu.Lock()
	if s.waits == nil {
		s.waits = map[uint64]wait{}
	}
	s.next++
	id := s.next
	sent := now.UnixNano()
	s.waits[id] = wait{sent: sent, due: sent + int64(stallFactor*max(ttft, 0))}
	s.mu.Unlock()
	var done atomic.Bool
	return func() {
		if done.Swap(true) {
			return
		}
		s.mu.Lock()
		delete(s.waits, id)
		s.mu.Unlock()
	}
}

// Heard records a sign of life from the engine at now: body bytes of any
// request. One atomic load and store (a few ns): it is called per relayed
// chunk.
func (e *Endpoint) Heard(now time.Time) {
	if ns := now.UnixNano(); ns > e.stall.heard.Load() {
		e.stall.heard.Store(ns)
	}
}

// Stalled reports whether the engine is held out of routing as stalled.
func (e *Endpoint) Stalled() bool { return e.stall.stalled.Load() }

// busy reports whether a request waits for its answer.
func (s *stallState) busy() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.waits) > 0
}

// probeAnswered notes a /health probe answered at now: a sign of life only while
// no request waits on the engine and only when its /metrics does not
// expose vLLM's token counters.
func (e *Endpoint) probeAnswered(now time.Time) {
	if e.stall.counters.Load() != countersPresent && !e.stall.busy() {
		e.Heard(now)
	}
}

// scraped notes a /metrics scrape answered at now with figures m: a sign
// of life when it shows progress (see the file comment).
func (e *Endpoint) scraped(now time.Time, m enginemetrics.Metrics) {
	s := &e.stall
	if slices.Contains(m.Missing, "vllm:prompt_tokens_total") && slices.Contains(m.Missing, "vllm:generation_tokens_total") {
		s.counters.Store(countersAbsent)
		e.Heard(now)
		return
	}
	s.counters.Store(countersPresent)
	p := progress{m.PromptTokens, m.GenerationTokens, m.PrefixCacheQueries, m.Running, m.Waiting}
	s.mu.Lock()
	moved := !s.seen || p != s.last
	idle := p.running == 0 && p.waiting == 0 && len(s.waits) == 0
	s.last, s.seen = p, true
	s.mu.Unlock()
	if moved || idle {
		e.Heard(now)
	}
}

// overdue returns how many requests wait, and the one sent first among
// those past their deadline whose engine was silent (nothing heard after
// heard) for window since they were sent; ok is false when there is none.
func (s *stallState) overdue(now, heard, floor, window int64) (n int, sent int64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.waits {
		if now < max(w.due, w.sent+floor) || now-max(heard, w.sent) < window {
			continue
		}
		if !ok || w.sent < sent {
			sent, ok = w.sent, true
		}
	}
	return len(s.waits), sent, ok
}

// stallWindow is how long an engine must show no sign of life, with a
// request overdue, to be declared stalled: StallAfter, and at least 1.5
// scrape intervals so that a scrape falls in it.
func (f *Fleet) stallWindow() time.Duration {
	w := f.cfg.StallAfter
	if f.cfg.ScrapeInterval > 0 {
		w = max(w, f.cfg.ScrapeInterval*3/2)
	}
	return w
}

// watchStalls checks every endpoint each StallAfter/4 (25ms..250ms) until
// ctx ends.
func (f *Fleet) watchStalls(ctx context.Context) {
	every := min(max(f.cfg.StallAfter/4, 25*time.Millisecond), 250*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, ep := range f.All() {
			f.checkStall(ep)
		}
	}
}

// checkStall declares ep stalled, or lets it back, at f's clock.
func (f *Fleet) checkStall(ep *Endpoint) {
	s := &ep.stall
	now := f.cfg.Now().UnixNano()
	heard := s.heard.Load()
	if s.stalled.Load() {
		s.mu.Lock()
		back := heard > s.stallAt
		if back {
			s.stalled.Store(false)
		}
		s.mu.Unlock()
		if !back {
			return
		}
		f.withMetrics(ep, func(m *metrics) {
			if ep.Up() {
				m.up.WithLabelValues(ep.name).Set(1)
			}
		})
		f.log.Info("stalled endpoint answers again", "endpoint", ep.name)
		f.refreshPanic(ep)
		return
	}
	n, sent, ok := s.overdue(now, heard, int64(f.cfg.StallAfter), int64(f.stallWindow()))
	if !ok {
		return
	}
	s.mu.Lock()
	s.stalled.Store(true)
	s.stallAt = now
	s.mu.Unlock()
	f.withMetrics(ep, func(m *metrics) {
		m.up.WithLabelValues(ep.name).Set(0)
		m.ejections.WithLabelValues(ep.name, "stall").Inc()
	})
	f.log.Warn("endpoint stalled: a request is overdue and the engine shows no sign of life; no new requests until it does",
		"endpoint", ep.name, "waiting", n, "overdue_wait_ms", (now-sent)/int64(time.Millisecond),
		"silent_ms", (now-max(heard, sent))/int64(time.Millisecond))
	f.refreshPanic(ep)
}
