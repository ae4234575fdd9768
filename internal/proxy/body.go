package proxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"kvrouter/internal/config"
	"kvrouter/internal/request"
)

// bodyChunk is the first buffer of a body (or the whole body, when it
// declares fewer bytes): the most of the body budget a request holds
// before its body's bytes arrive.
const bodyChunk = 4 << 10

// readBody reads the request body whole within config.Config.BodyLimit, holding
// config.Config.BodyBudget for its buffer (x.bodyHeld, given back by finish),
// waiting at most HTTP.BodyIdleTimeout for each part of it and
// HTTP.BodyTimeout for all of it. It reads into parts of bodyChunk, then
// twice as much each (cut to the declared length), made as the bytes
// arrive, the budget taken before each, and joins them when the body is
// whole. It answers the
// client and returns false on any failure: 413 over the limit (at once
// for a declared length), 503 with Retry-After when the budget is spent,
// 408 when the client stops sending or is too slow, 400 otherwise.
func (s *Server) readBody(x *exchange) ([]byte, bool) {
	for _, e := range []*request.Error{request.CheckContentType(x.r.Header.Get("Content-Type")),
		request.CheckContentEncoding(x.r.Header.Get("Content-Encoding"))} {
		if e != nil {
			s.fail(x, requestError(e), outcomeBadRequest)
			return nil, false
		}
	}
	limit := s.cfg.BodyLimit
	cl := x.r.ContentLength // -1: unknown
	tooLarge := func() ([]byte, bool) {
		s.lm.bodyRej.WithLabelValues("too_large").Inc()
		x.w.Header().Set("Connection", "close") // the rest is not read
		s.fail(x, &apiError{status: http.StatusRequestEntityTooLarge, typ: typeInvalidRequest,
			message: fmt.Sprintf("request body larger than %d bytes", limit)}, outcomeBadRequest)
		return nil, false
	}
	if cl > limit {
		return tooLarge()
	}
	// The body is read into parts that double in size as its bytes
	// arrive (cut to the declared length, or to one byte past the limit
	// to tell a chunked body too large), each taken from the budget
	// before it is made, and joined once whole: holding the budget costs
	// the client the bytes it sent, and an unfinished body leaves no
	// garbage behind its growth.
	ceiling := limit + 1
	if cl >= 0 {
		ceiling = cl
	}
	var parts [][]byte
	cur := []byte{} // the part being filled
	var total, held, next int64 = 0, 0, bodyChunk
	rc := http.NewResponseController(x.w)
	idle := orDefault(s.cfg.HTTP.BodyIdleTimeout, config.Default().HTTP.BodyIdleTimeout)
	whole := orDefault(s.cfg.HTTP.BodyTimeout, config.Default().HTTP.BodyTimeout)
	end := time.Now().Add(whole)
	// Streams outlive the body: the deadline is lifted once it is whole.
	// A failed read keeps it, so that nothing more is read (closeUnread).
	for cl < 0 || total < cl {
		if len(cur) == cap(cur) {
			if total > limit {
				return tooLarge()
			}
			n := min(next, ceiling-total)
			next *= 2
			if !s.holdBody(x, n) {
				return nil, false
			}
			held += n
			if cap(cur) > 0 {
				parts = append(parts, cur)
			}
			cur = make([]byte, 0, n)
		}
		deadline := time.Now().Add(idle)
		if end.Before(deadline) {
			deadline = end
		}
		_ = rc.SetReadDeadline(deadline) // unsupported: the server's own limits
		n, err := x.r.Body.Read(cur[len(cur):cap(cur)])
		cur = cur[:len(cur)+n]
		total += int64(n)
		if err == nil {
			continue
		}
		if err == io.EOF {
			break
		}
		var ne net.Error
		switch {
		case errors.As(err, &ne) && ne.Timeout():
			// Before the context check: net/http cancels the request's
			// context on any read error of its connection.
			reason, msg := "idle", fmt.Sprintf("request body: nothing received for %v (http.body_idle_timeout)", idle)
			if !time.Now().Before(end) {
				reason, msg = "timeout", fmt.Sprintf("request body: not whole after %v (http.body_timeout)", whole)
			}
			s.lm.bodyRej.WithLabelValues(reason).Inc()
			x.w.Header().Set("Connection", "close")
			s.fail(x, &apiError{status: http.StatusRequestTimeout, typ: typeInvalidRequest, message: msg}, outcomeBadRequest)
		case x.r.Context().Err() != nil:
			x.outcome, x.status = outcomeClientClosed, 499
		default:
			s.fail(x, badRequest("", "reading request body: "+err.Error()), outcomeBadRequest)
		}
		return nil, false
	}
	if total > limit {
		return tooLarge()
	}
	_ = rc.SetReadDeadline(time.Time{})
	if len(parts) == 0 {
		return cur, true
	}
	// Joined: the budget then holds the body's length (the parts are
	// garbage once copied).
	body := make([]byte, 0, total)
	for _, p := range append(parts, cur) {
		body = append(body, p...)
	}
	s.giveBody(held - total)
	x.bodyHeld -= held - total
	return body, true
}

// holdBody takes n more bytes of the body budget for x; when they do not
// fit it answers 503 with Retry-After and returns false.
func (s *Server) holdBody(x *exchange, n int64) bool {
	if s.bodies.Take(n) {
		s.lm.bodies.Add(float64(n))
		x.bodyHeld += n
		return true
	}
	s.lm.bodyRej.WithLabelValues("budget").Inc()
	x.w.Header().Set("Connection", "close") // the body is not read
	s.fail(x, &apiError{status: http.StatusServiceUnavailable, typ: typeServiceUnavailable, retryAfter: time.Second,
		message: fmt.Sprintf("the router holds too many request bodies (body_budget %d bytes): retry later", s.bodies.Max())}, outcomeBadRequest)
	return false
}

// giveBody returns n bytes of the body budget the HTTP front held.
func (s *Server) giveBody(n int64) {
	s.bodies.Give(n)
	s.lm.bodies.Sub(float64(n))
}
