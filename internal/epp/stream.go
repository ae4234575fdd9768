package epp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"kvrouter/internal/frontmetrics"
	"kvrouter/internal/pick"
)

// phase is where an exchange is in the ext_proc sequence.
type phase uint8

const (
	phaseStart    phase = iota // waiting for the request headers
	phaseBody                  // request headers in, body chunks arriving
	phasePicked                // pick sent, waiting for the response headers
	phaseResponse              // response headers in, body chunks passing
	phaseDone                  // response ended (or answered by the picker)
)

// exchange is one ext_proc stream: one HTTP request and its response.
// Only its stream's goroutine touches it.
type exchange struct {
	s      *Server
	stream extprocv3.ExternalProcessor_ProcessServer
	phase  phase

	headers   map[string]string
	id        string
	allow     func(string) bool
	body      assembler
	trailers  bool // the request body ended with trailers
	start     time.Time
	lastEvent time.Time // when the last chunk completing an event came (streamed responses)

	pick    *pick.Pick
	model   string // metric label: a configured model, "unknown", or "" (passthrough)
	replica string
	status  int
	track   tracker
	outcome string
	held    []string // engines whose series this stream holds (Server.holds)
}

// rankHeader is vLLM's data-parallel rank request header, lower-cased as
// ext_proc gives headers.
const rankHeader = "x-data-parallel-rank"

// dropped lists the request headers the gateway must remove before it
// forwards: a client's data-parallel rank unless clients.allow_dp_rank
// (counted as the HTTP front counts it).
func (x *exchange) dropped() []string {
	if _, ok := x.headers[rankHeader]; !ok || x.s.pick.AllowDPRank() {
		return nil
	}
	x.s.pick.CountClientControl("dp_rank")
	return []string{rankHeader}
}

// errStop ends the stream after a local reply.
var errStop = errors.New("stream answered")

func (x *exchange) run() error {
	for {
		req, err := x.stream.Recv()
		if err == io.EOF || status.Code(err) == codes.Canceled || errors.Is(err, context.Canceled) {
			return nil // the gateway closed the stream: close() ends the request
		}
		if err != nil {
			return err
		}
		if err := x.handle(req); err != nil {
			if errors.Is(err, errStop) {
				return nil
			}
			return err
		}
	}
}

func (x *exchange) handle(req *extprocv3.ProcessingRequest) error {
	switch v := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		if x.phase != phaseStart {
			return x.protocol("request headers after the request started")
		}
		x.start = time.Now()
		x.headers = readHeaders(v.RequestHeaders.GetHeaders())
		x.id = x.headers["x-request-id"]
		if x.id == "" || len(x.id) > 256 {
			x.id = newID()
		}
		if set, ok := subset(req.GetMetadataContext(), x.s.cfg.SubsetNamespace); ok {
			x.allow = func(a string) bool { return set[a] }
		}
		x.phase = phaseBody
		if v.RequestHeaders.GetEndOfStream() {
			return x.complete(false)
		}
		return nil // buffer the body first: the pick needs it
	case *extprocv3.ProcessingRequest_RequestBody:
		if x.phase != phaseBody {
			if x.phase == phaseStart {
				return x.protocol("request body before the request headers")
			}
			return x.protocol("request body after its end of stream")
		}
		b := v.RequestBody
		if err := x.body.add(b.GetBody(), b.GetEndOfStream()); err != nil {
			if errors.Is(err, errBodyTooLarge) {
				return x.fail(x.s.pick.TooLarge())
			}
			if errors.Is(err, errBodyBudget) {
				msg := fmt.Sprintf("the endpoint picker holds too many request bodies (body_budget %d bytes): retry later", x.s.bodies.Max())
				return x.fail(&pick.Error{Status: http.StatusServiceUnavailable, RetryAfter: 1, Outcome: frontmetrics.OutcomeBadRequest,
					Body: pick.ErrorBody(http.StatusServiceUnavailable, "", "", msg), Err: err})
			}
			return x.protocol(err.Error())
		}
		if b.GetEndOfStream() {
			return x.complete(true)
		}
		return nil
	case *extprocv3.ProcessingRequest_RequestTrailers:
		if x.phase != phaseBody {
			return x.protocol("request trailers out of order")
		}
		if _, ok := x.body.finish(); !ok {
			return x.protocol("request trailers after the body's end of stream")
		}
		x.trailers = true
		return x.complete(true)
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		if x.phase != phasePicked {
			return x.protocol("response headers before the pick")
		}
		return x.responseHeaders(req, v.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		if x.phase != phaseResponse {
			return x.protocol("response body out of order")
		}
		return x.responseBody(v.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		if x.phase != phaseResponse {
			return x.protocol("response trailers out of order")
		}
		if err := x.stream.Send(trailersResponse(false)); err != nil {
			return err
		}
		x.track.end()
		x.end(true)
		return nil
	}
	return x.protocol(fmt.Sprintf("unexpected message %T", req.GetRequest()))
}

// complete picks once the request is complete and answers the request
// headers, then (withBody) the body.
func (x *exchange) complete(withBody bool) error {
	path, method := x.headers[":path"], x.headers[":method"]
	if method != http.MethodPost || !inference(path) {
		return x.passthrough(withBody)
	}
	t0 := time.Now()
	pk, perr := x.s.pick.Pick(x.stream.Context(), pick.Input{
		Path: path, Header: func(n string) string { return x.headers[n] }, Body: x.body.buf,
		RequestID: x.id, Allow: x.allow, MaxInFlight: x.s.cfg.MaxInFlight,
	})
	x.body.buf = nil
	if perr != nil {
		return x.fail(perr)
	}
	x.pick, x.model, x.replica = pk, pk.Model, pk.Replica
	x.s.holds.Hold(&x.held, pk.Replica)
	x.s.m.InFlight.WithLabelValues(pk.Replica).Inc()
	dest := strings.Join(append([]string{pk.Addr}, pk.Fallbacks...), ",")
	set := []*corev3.HeaderValueOption{
		setHeader(DestinationKey, dest),
		setHeader("content-length", strconv.Itoa(len(pk.Body))),
		setHeader("x-request-id", x.id),
	}
	if pk.APIKey != "" {
		set = append(set, setHeader("authorization", "Bearer "+pk.APIKey))
	}
	if err := x.stream.Send(requestHeadersResponse(set, x.dropped(), destination(x.s.cfg.DestinationNamespace, dest))); err != nil {
		return err
	}
	x.s.m.pick.WithLabelValues(pk.Model).Observe(time.Since(t0).Seconds())
	x.s.m.Decision.WithLabelValues(pk.Model).Observe(pk.Decision.Seconds())
	if pk.Tokenized {
		x.s.m.PromptTokens.WithLabelValues(pk.Model).Observe(float64(pk.PromptTokens))
		x.s.m.CachedTokens.WithLabelValues(pk.Model).Observe(float64(pk.CachedTokens))
	}
	if pk.Shadow != nil { // once per pick sent, beside prompt_tokens (frontmetrics.Front.ObserveShadow)
		x.s.m.ObserveShadow(pk.Model, pk.Shadow.Replica == pk.Replica, pk.Shadow.CachedTokens)
	}
	x.phase = phasePicked
	if withBody {
		return x.sendBody(pk.Body)
	}
	return nil
}

// passthrough sends a request that is not an inference request (GET
// /v1/models, ...) to an endpoint without routing or a lease.
func (x *exchange) passthrough(withBody bool) error {
	name, addr, ok := x.s.pick.EndpointNamed(x.allow)
	if !ok {
		return x.fail(&pick.Error{Status: http.StatusServiceUnavailable, RetryAfter: 1, Outcome: outcomeNoReplica,
			Body: pick.ErrorBody(http.StatusServiceUnavailable, "", "", "no healthy replica")})
	}
	x.outcome, x.replica = outcomePassthrough, name
	x.s.holds.Hold(&x.held, name)
	set := []*corev3.HeaderValueOption{setHeader(DestinationKey, addr), setHeader("x-request-id", x.id)}
	if err := x.stream.Send(requestHeadersResponse(set, x.dropped(), destination(x.s.cfg.DestinationNamespace, addr))); err != nil {
		return err
	}
	x.phase = phasePicked
	if withBody {
		b := x.body.buf
		x.body.buf = nil
		return x.sendBody(b)
	}
	return nil
}

// sendBody streams the request body back in chunks, the last with end of
// stream unless trailers follow (then the trailers are answered too).
func (x *exchange) sendBody(b []byte) error {
	cs := chunks(b)
	for i, c := range cs {
		if err := x.stream.Send(streamedBody(true, c, i == len(cs)-1 && !x.trailers)); err != nil {
			return err
		}
	}
	if x.trailers {
		return x.stream.Send(trailersResponse(true))
	}
	return nil
}

func (x *exchange) responseHeaders(req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) error {
	hs := readHeaders(h.GetHeaders())
	x.status, _ = strconv.Atoi(hs[":status"])
	x.track.sse = strings.HasPrefix(strings.ToLower(hs["content-type"]), "text/event-stream")
	var set []*corev3.HeaderValueOption
	if pk := x.pick; pk != nil {
		served := metadataField(req.GetMetadataContext(), x.s.cfg.DestinationNamespace, ServedKey).GetStringValue()
		old := pk.Replica
		moved, err := pk.Served(served)
		switch {
		case err != nil:
			x.s.log.Warn("served endpoint unknown; the request's lease ends", "request_id", x.id, "served", served, "err", err)
			x.s.m.InFlight.WithLabelValues(old).Dec()
			x.pick = nil
		case moved:
			x.s.m.moved.WithLabelValues(pk.Model).Inc()
			x.s.holds.Hold(&x.held, pk.Replica)
			x.s.m.InFlight.WithLabelValues(old).Dec()
			x.s.m.InFlight.WithLabelValues(pk.Replica).Inc()
			x.replica = pk.Replica
		}
		if x.pick != nil {
			pk.Status(x.status)
			set = append(set, setHeader("x-kvrouter-replica", pk.Replica), setHeader("x-kvrouter-cached-tokens", strconv.Itoa(pk.CachedTokens)))
		}
	}
	set = append(set, setHeader("x-request-id", x.id))
	if err := x.stream.Send(responseHeadersResponse(set)); err != nil {
		return err
	}
	x.phase = phaseResponse
	if h.GetEndOfStream() {
		x.end(true)
	}
	return nil
}

func (x *exchange) responseBody(b *extprocv3.HttpBody) error {
	if len(b.GetBody()) > 0 && x.pick != nil {
		x.pick.FirstByte()
	}
	events := x.track.events
	x.track.feed(b.GetBody())
	if x.track.events > events && x.pick != nil && x.status/100 == 2 {
		x.observeEvents(time.Now())
	}
	if err := x.stream.Send(streamedBody(false, b.GetBody(), b.GetEndOfStream())); err != nil {
		return err
	}
	if b.GetEndOfStream() {
		x.track.end()
		x.end(true)
	}
	return nil
}

// observeEvents records a streamed response's chunk that completed an
// event, seen at now: the first gives time to first token from the
// request headers' arrival, the next ones the inter-token latency. The
// gateway hands the picker each chunk as it comes from the engine and
// forwards it to the client once answered, so these are the times the
// gateway saw the events, one gRPC hop later, and before the client did.
func (x *exchange) observeEvents(now time.Time) {
	if x.lastEvent.IsZero() {
		x.s.m.TTFT.WithLabelValues(x.model).Observe(now.Sub(x.start).Seconds())
	} else {
		x.s.m.ITL.WithLabelValues(x.model).Observe(now.Sub(x.lastEvent).Seconds())
	}
	x.lastEvent = now
}

// end ends the request: complete tells the response reached its end. The
// lease is released once (End is idempotent; close calls end too).
func (x *exchange) end(complete bool) {
	if x.phase == phaseDone {
		return
	}
	x.phase = phaseDone
	ok := complete && x.status/100 == 2 && !x.track.errored
	switch {
	case x.outcome == outcomePassthrough:
	case !complete:
		x.outcome = outcomeClientClosed
	case ok:
		x.outcome = outcomeOK
	default:
		x.outcome = outcomeEngineError
	}
	if x.pick != nil {
		x.pick.End(ok)
		x.s.m.InFlight.WithLabelValues(x.pick.Replica).Dec()
		if u := x.track.usage; u != nil {
			x.s.m.usageTokens.WithLabelValues(x.model, "prompt").Add(float64(u.PromptTokens))
			x.s.m.usageTokens.WithLabelValues(x.model, "completion").Add(float64(u.CompletionTokens))
			if u.PromptTokensDetails != nil {
				x.s.m.usageTokens.WithLabelValues(x.model, "cached").Add(float64(u.PromptTokensDetails.CachedTokens))
			}
		}
	}
	x.record(nil)
}

// close runs when the stream ends, however it ends: a request not ended
// yet (the gateway or the client went away) releases its lease here.
func (x *exchange) close() {
	if x.phase == phaseStart || x.phase == phaseDone {
		return
	}
	if x.model == "" && x.outcome != outcomePassthrough {
		x.model = "unknown"
	}
	x.end(false)
}

// fail answers e as a local reply and ends the stream.
func (x *exchange) fail(e *pick.Error) error {
	ended := x.phase == phaseDone
	x.phase = phaseDone
	x.outcome, x.status = e.Outcome, e.Status
	x.model = e.Model
	if x.model == "" {
		x.model = "unknown"
	}
	if x.pick != nil && !ended {
		x.pick.End(false)
		x.s.m.InFlight.WithLabelValues(x.pick.Replica).Dec()
	}
	x.record(e.Err)
	if err := x.stream.Send(immediate(e.Status, e.Body, e.RetryAfter, "kvrouter_"+e.Outcome)); err != nil {
		return err
	}
	return errStop
}

// protocol answers a malformed ext_proc sequence with a 500.
func (x *exchange) protocol(msg string) error {
	if x.model == "" {
		x.model = "unknown"
	}
	return x.fail(&pick.Error{Status: http.StatusInternalServerError, Outcome: outcomeProtocol, Model: x.model,
		Body: pick.ErrorBody(http.StatusInternalServerError, "", "", "endpoint picker: malformed ext_proc sequence: "+msg), Err: errors.New(msg)})
}

// record counts the request and logs its one line.
func (x *exchange) record(err error) {
	x.s.m.Requests.WithLabelValues(x.model, x.replica, x.outcome).Inc()
	lvl := slog.LevelInfo
	if x.outcome == outcomeProtocol || x.outcome == outcomeUpstream || x.status >= 500 {
		lvl = slog.LevelWarn
	}
	ctx := x.stream.Context()
	if !x.s.log.Enabled(ctx, lvl) {
		return
	}
	attrs := []slog.Attr{slog.String("request_id", x.id), slog.String("model", x.model), slog.String("replica", x.replica),
		slog.Int("status", x.status), slog.String("outcome", x.outcome)}
	if x.pick != nil {
		attrs = append(attrs, slog.Int("cached_tokens", x.pick.CachedTokens), slog.Int("prompt_tokens", x.pick.PromptTokens))
	}
	if u := x.track.usage; u != nil && u.PromptTokensDetails != nil {
		attrs = append(attrs, slog.Int("engine_cached_tokens", u.PromptTokensDetails.CachedTokens))
	}
	if !x.start.IsZero() {
		attrs = append(attrs, slog.Float64("duration_ms", float64(time.Since(x.start).Microseconds())/1000))
	}
	if err != nil {
		attrs = append(attrs, slog.String("err", err.Error()))
	}
	x.s.log.LogAttrs(ctx, lvl, "epp request", attrs...)
}

func inference(path string) bool {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	return path == "/v1/completions" || path == "/v1/chat/completions"
}

func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}
