package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"kvrouter/internal/fleet"
	"kvrouter/internal/group"
	"kvrouter/internal/routing"
)

// Causes of an upstream request's cancellation.
var (
	errFirstByteTimeout = errors.New("first-byte timeout")
	errIdleTimeout      = errors.New("idle timeout")
)

// maxReroutes bounds the decisions of one request made void by engines
// removed while it was routed (each is followed by a fresh healthy list).
const maxReroutes = 3

// forward routes x and relays the engine's answer, retrying on another
// replica while nothing has reached the client. Its features' stages
// (x.hooks) plan the request first, narrow each attempt's engines, act on
// the chosen engine, give the body and tell which failures may be retried.
func (s *Server) forward(ctx context.Context, x *exchange) {
	if !x.hooks.plan(ctx, x) {
		return
	}
	if e := s.core.TooLong(ctx, &x.Flow); e != nil {
		s.fail(x, requestError(e), outcomeBadRequest)
		return
	}
	var tried []string
	var buf []*fleet.Endpoint
	reroutes := 0 // decisions made void by an engine removed meanwhile
	for attempt := 0; ; attempt++ {
		var retry time.Duration
		var err error
		buf, retry, err = s.healthy(buf[:0], x)
		cands := make([]string, 0, len(buf))
		for _, ep := range buf {
			if !slices.Contains(tried, ep.Name()) {
				cands = append(cands, ep.Name())
			}
		}
		if len(cands) == 0 {
			if err == nil {
				err = fmt.Errorf("every healthy replica tried: %w", fleet.ErrNoEndpoint)
			}
			s.noReplica(x, retry, err)
			return
		}
		d, err := s.core.Decide(x.Ctx, &x.Flow, s.core.RouteInput(x.Ctx, &x.Flow, cands, false))
		if err != nil {
			if errors.Is(err, routing.ErrNoReplica) && reroutes < maxReroutes {
				// The group lost its candidates after Healthy listed them
				// (engines removed while serving): list again.
				reroutes++
				attempt--
				continue
			}
			s.fail(x, serverError("routing: "+err.Error()), outcomeUpstream)
			return
		}
		ep := s.deps.Fleet.Endpoint(d.Replica)
		if ep == nil || !slices.Contains(cands, d.Replica) {
			if d.Release != nil {
				d.Release()
			}
			if ep == nil && slices.Contains(cands, d.Replica) && reroutes < maxReroutes {
				// Removed from the fleet between Healthy and the decision:
				// route again among the engines left.
				reroutes++
				attempt--
				continue
			}
			s.fail(x, serverError(fmt.Sprintf("router chose unknown replica %q", d.Replica)), outcomeUpstream)
			return
		}
		if !x.hooks.chosen(ctx, x, ep) {
			if d.Release != nil {
				d.Release()
			}
			return
		}
		s.observeDecision(x, d)
		tried = append(tried, d.Replica)
		if !s.try(ctx, x, ep, d, attempt) {
			return
		}
		x.retries++
	}
}

// observeDecision records the decision's predictions.
func (s *Server) observeDecision(x *exchange, d group.Decision) {
	s.holds.Hold(&x.held, d.Replica)
	x.replica, x.cached, x.indexCached = d.Replica, d.CachedTokens, d.IndexCachedTokens
	s.traceDecision(x, d)
	model := x.Req.Model
	if x.Tokens != nil {
		s.m.promptTokens.WithLabelValues(model).Observe(float64(len(x.Tokens)))
		s.m.cachedTokens.WithLabelValues(model).Observe(float64(d.CachedTokens))
	}
	if d.Shadow != nil { // each attempt, as prompt_tokens (frontmetrics.Front.ObserveShadow)
		s.m.view.ObserveShadow(model, d.Shadow.Replica == d.Replica, d.Shadow.CachedTokens)
	}
}

// try sends attempt (0-based) to ep. It returns true when the caller
// should retry on another replica (only when x.hooks.retry allows it and
// nothing was written to the client); otherwise the exchange is answered,
// one way or another.
func (s *Server) try(ctx context.Context, x *exchange, ep *fleet.Endpoint, d group.Decision, attempt int) (retry bool) {
	if d.Release != nil {
		defer d.Release()
	}
	failed := d.Failed
	if failed == nil {
		failed = func() {}
	}
	ok := false // the engine answered 2xx and it reached the client whole
	defer func() {
		if !ok {
			failed() // before Release: the request's predictions go
		}
	}()
	ctx, wd, end := s.startAttempt(ctx, x, ep, d.PredictedTTFT)
	defer end()

	legCtx, leg := s.startLeg(ctx, x, ep)
	legStatus := 0
	defer func() {
		var err error
		if !retry && x.outcome != outcomeOK && x.outcome != outcomeEngineError {
			err = x.err
		}
		endLeg(leg, legStatus, retry, err)
	}()
	body := x.hooks.body(ep.Name())
	req, err := http.NewRequestWithContext(legCtx, http.MethodPost, ep.URL()+x.Req.Kind.Path(), bytes.NewReader(body))
	if err != nil {
		s.fail(x, serverError(err.Error()), outcomeUpstream)
		return false
	}
	outHeaders(req.Header, x.r.Header, x.ID, ep.APIKey())
	s.tr.Propagator.Inject(legCtx, propagation.HeaderCarrier(req.Header))
	if d.HasDPRank {
		req.Header.Set(RankHeader, strconv.Itoa(d.DPRank))
	}
	req.ContentLength = int64(len(body))

	resp, err := x.m.transport.RoundTrip(req)
	if err != nil {
		return s.upstreamFailed(ctx, x, ep, err, x.hooks.retry(attempt, 0))
	}
	status := resp.StatusCode
	if status/100 != 2 {
		// An error answer ends the wait, but neither it nor its body is a
		// sign that the engine works: vLLM's API server answers errors,
		// and headers, while its core is hung. The first body byte of a
		// 2xx answer is one (watchdog.progress).
		wd.answered()
		wd.ep = nil
	}
	legStatus = status
	s.deps.Fleet.Report(ep, fleet.OutcomeOf(status))
	if status/100 != 2 {
		failed() // as soon as the engine's error status is known
	}
	if x.hooks.retry(attempt, status) {
		// Backpressure or a gateway's failure: nothing was written, try
		// another replica. Drain a little so the connection may be reused.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		resp.Body.Close()
		s.m.retries.WithLabelValues(x.Req.Model, "status_"+strconv.Itoa(status)).Inc()
		return true
	}
	defer resp.Body.Close()
	x.hit = hitReport{}
	s.relay(ctx, x, ep, wd, resp, d.FirstToken, failed)
	ok = status/100 == 2 && x.outcome == outcomeOK
	if ok && x.Tokens != nil && x.hit.seen {
		s.trust.observe(x.m.Router, x.Req.Model, ep.Name(), x.indexCached, x.hit.cached)
	}
	return false
}

// startAttempt begins one request of x to ep (an attempt, a P/D leg, a
// pass-through), predicted to take ttft to its first token (0: unknown;
// the fleet's stall detector waits on it, fleet/stall.go): ep's series are
// held for x, its in-flight counts (the proxy's gauge and the fleet
// endpoint's) go up, and the context returned,
// a child of ctx (the client's request context), is cancelled by the first-byte and idle
// watchdog wd (its cause says which). end stops the watchdog, cancels ctx
// and takes the in-flight counts down; call it exactly once.
func (s *Server) startAttempt(ctx context.Context, x *exchange, ep *fleet.Endpoint, ttft time.Duration) (_ context.Context, wd *watchdog, end func()) {
	s.holds.Hold(&x.held, ep.Name())
	inflight := s.m.inFlight.WithLabelValues(ep.Name())
	inflight.Inc()
	ep.AddInFlight(1)
	answered := ep.Await(time.Now(), ttft) // stall detection (fleet/stall.go)
	ctx, cancel := context.WithCancelCause(ctx)
	wd = newWatchdog(cancel, x.m.Cfg.Timeouts.FirstByte, x.m.Cfg.Timeouts.Idle)
	wd.ep, wd.answered = ep, answered
	return ctx, wd, func() {
		answered()
		wd.stop()
		cancel(nil)
		ep.AddInFlight(-1)
		inflight.Dec()
	}
}

// upstreamFailed handles a RoundTrip error (nothing received from the
// engine, nothing written to the client).
func (s *Server) upstreamFailed(ctx context.Context, x *exchange, ep *fleet.Endpoint, err error, canRetry bool) bool {
	x.err = err
	switch cause := context.Cause(ctx); {
	case x.r.Context().Err() != nil:
		x.status, x.outcome = 499, outcomeClientClosed
		return false
	case errors.Is(cause, errFirstByteTimeout):
		s.fail(x, &apiError{status: http.StatusGatewayTimeout, typ: typeServer,
			message: fmt.Sprintf("replica %s sent nothing within %v (request id %s)", ep.Name(), x.m.Cfg.Timeouts.FirstByte, x.ID)}, outcomeTimeout)
		return false
	}
	s.deps.Fleet.Report(ep, fleet.OutcomeOfError(err))
	if canRetry {
		s.m.retries.WithLabelValues(x.Req.Model, "conn_error").Inc()
		return true
	}
	// The cause (addresses, syscalls) goes to the log line with the
	// request id, not to the client.
	s.fail(x, &apiError{status: http.StatusBadGateway, typ: typeServer,
		message: fmt.Sprintf("replica %s could not be reached (request id %s)", ep.Name(), x.ID)}, outcomeUpstream)
	x.err = fmt.Errorf("replica %s: %w", ep.Name(), err)
	return false
}

// watchdog cancels an upstream request that stays silent too long: until
// the first body byte for firstByte, then between chunks for idle. Progress
// after the first byte is one atomic store (no timer reset per event): when
// the timer fires, it re-arms itself for the rest of the idle period counted
// from the last progress, and cancels only when that period is over.
type watchdog struct {
	t       *time.Timer
	idle    time.Duration
	base    time.Time
	last    atomic.Int64 // time of the last progress, ns since base
	first   atomic.Bool
	stopped atomic.Bool
	// ep hears of every chunk, and answered ends the attempt's wait for
	// its first byte (fleet stall detection); ep is nil in tests that make
	// a bare watchdog, and once the engine answered an error status.
	ep       *fleet.Endpoint
	answered func()
}

func newWatchdog(cancel context.CancelCauseFunc, firstByte, idle time.Duration) *watchdog {
	w := &watchdog{idle: idle, base: time.Now()}
	w.t = time.AfterFunc(firstByte, func() {
		if !w.first.Load() {
			cancel(errFirstByteTimeout)
			return
		}
		silent := time.Since(w.base) - time.Duration(w.last.Load())
		if silent < w.idle {
			if !w.stopped.Load() {
				w.t.Reset(w.idle - silent)
			}
			return
		}
		cancel(errIdleTimeout)
	})
	return w
}

// progress notes that body bytes arrived at now, a sign of life of the
// engine that ends the attempt's wait (fleet stall detection), and
// restarts the idle clock.
func (w *watchdog) progress(now time.Time) {
	w.output(now)
	w.bytes(now)
}

// output tells the fleet the engine produced output at now: a sign of
// life that ends the attempt's wait for its first byte.
func (w *watchdog) output(now time.Time) {
	if w.ep != nil {
		w.ep.Heard(now)
		w.answered()
	}
}

// bytes notes that body bytes arrived at now (the first byte ends the
// first-byte timeout) and restarts the idle clock, without telling the
// fleet: a Responses stream's opening events come before any output.
func (w *watchdog) bytes(now time.Time) {
	w.last.Store(int64(now.Sub(w.base)))
	if !w.first.Load() {
		w.first.Store(true)
		w.t.Reset(w.idle)
	}
}

func (w *watchdog) stop() {
	w.stopped.Store(true)
	w.t.Stop()
}

// retryableStatus reports whether an engine's answer status means another
// engine may serve the request: backpressure (429) or a gateway's failure
// (502, 503).
func retryableStatus(status int) bool {
	return status == http.StatusTooManyRequests || status == http.StatusBadGateway || status == http.StatusServiceUnavailable
}
