package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"kvrouter/internal/fleet"
	"kvrouter/internal/request"
)

// hopHeaders are hop-by-hop headers (RFC 9110 7.6.1), never relayed.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// copyHeaders copies src to dst without hop-by-hop headers, including those
// named in src's Connection header, and without the names in skip.
func copyHeaders(dst, src http.Header, skip ...string) {
	var conn []string
	for _, v := range src["Connection"] {
		for f := range strings.SplitSeq(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				conn = append(conn, http.CanonicalHeaderKey(f))
			}
		}
	}
next:
	for k, vv := range src {
		for _, h := range hopHeaders {
			if k == h {
				continue next
			}
		}
		for _, h := range conn {
			if k == h {
				continue next
			}
		}
		for _, h := range skip {
			if k == h {
				continue next
			}
		}
		dst[k] = append(dst[k][:0:0], vv...)
	}
}

// outHeaders fills the engine request's headers from the client's: no
// hop-by-hop headers, no client credentials (the engine's own key instead),
// no Accept-Encoding (bytes are relayed as they are), the request id.
func outHeaders(dst, client http.Header, id, apiKey string) {
	copyHeaders(dst, client, "Authorization", "Accept-Encoding", "Content-Length", "Cookie",
		"X-Kvrouter-Route-Only", "X-Request-Id")
	dst.Set("Content-Type", "application/json")
	dst.Set("X-Request-Id", id)
	if apiKey != "" {
		dst.Set("Authorization", "Bearer "+apiKey)
	}
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// relay writes the engine's response to the client as it arrives; failed
// is called as soon as an event stream carries an engine error event.
func (s *Server) relay(ctx context.Context, x *exchange, ep *fleet.Endpoint, wd *watchdog, resp *http.Response, firstToken, failed func()) {
	if firstToken == nil {
		firstToken = func() {}
	}
	h := x.w.Header()
	copyHeaders(h, resp.Header, "X-Request-Id")
	if x.hooks.filter != nil {
		h.Del("Content-Length") // the filter may change the body
	}
	h.Set("X-Kvrouter-Replica", ep.Name())
	h.Set("X-Kvrouter-Cached-Tokens", strconv.Itoa(x.cached))
	x.status = resp.StatusCode
	x.outcome = outcomeOK
	if resp.StatusCode >= 400 {
		x.outcome = outcomeEngineError
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	sse := mt == "text/event-stream"
	if sse {
		// The router may end the stream with its own error event: the
		// engine's length (an empty stream's 0) would forbid it.
		h.Del("Content-Length")
	}
	x.w.WriteHeader(resp.StatusCode)
	if sse {
		// The engine opened its stream: let the client see it open too.
		_ = http.NewResponseController(x.w).Flush()
	}

	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	var err error
	var body io.Reader = resp.Body
	var kept *capBuffer // a non-streaming answer, for its usage (trust.go)
	if !sse && resp.StatusCode/100 == 2 && x.Tokens != nil {
		kept = &capBuffer{max: maxUsageBody}
		body = io.TeeReader(resp.Body, kept)
		defer func() { x.hit.note(kept.b, false) }()
	}
	if sse {
		var done bool
		done, err = s.copyEvents(x, wd, body, *bp, firstToken, failed)
		if err == nil && !done && resp.StatusCode < 300 {
			// vLLM ends every successful stream with data: [DONE]; an
			// engine stopped mid-generation (SIGTERM) closes cleanly
			// without it. The client must not take that as a whole answer.
			err = errNoDone
		}
	} else if x.hooks.filter != nil {
		err = copyFiltered(x, wd, body, firstToken)
	} else {
		err = copyBody(x.w, wd, body, *bp, firstToken)
	}
	if err == nil {
		if x.streamErr {
			x.outcome = outcomeEngineError
		}
		return
	}
	var werr *writeError
	var public string // what the client is told: the engine's name, no addresses
	switch cause := context.Cause(ctx); {
	case errors.As(err, &werr) || x.r.Context().Err() != nil:
		// The client left: the deferred cancel closes the engine request.
		x.status, x.outcome, x.err = 499, outcomeClientClosed, err
		return
	case errors.Is(cause, errFirstByteTimeout) || errors.Is(cause, errIdleTimeout):
		x.outcome, x.err = outcomeTimeout, fmt.Errorf("replica %s: %w", ep.Name(), cause)
		public = fmt.Sprintf("replica %s: %v", ep.Name(), cause)
	case errors.Is(err, errNoDone):
		x.outcome, x.err = outcomeUpstream, fmt.Errorf("replica %s: %w", ep.Name(), err)
		public = fmt.Sprintf("replica %s ended the stream before it was complete", ep.Name())
		s.deps.Fleet.Report(ep, fleet.OutcomeConnError)
	default:
		x.outcome, x.err = outcomeUpstream, fmt.Errorf("replica %s: reading: %w", ep.Name(), err)
		public = fmt.Sprintf("replica %s stopped answering mid-response", ep.Name())
		s.deps.Fleet.Report(ep, fleet.OutcomeConnError)
	}
	if !sse {
		x.abort = true
		return
	}
	// The detail (addresses, syscalls) is in the request's log line.
	_, _ = x.w.Write(sseError(public+" (request id "+x.ID+")", http.StatusBadGateway))
	_ = http.NewResponseController(x.w).Flush()
}

// errNoDone marks an event stream that ended without vLLM's final
// "data: [DONE]" event.
var errNoDone = errors.New("event stream ended without data: [DONE]")

// writeError marks a failure to write to the client.
type writeError struct{ err error }

func (e *writeError) Error() string { return "writing: " + e.err.Error() }
func (e *writeError) Unwrap() error { return e.err }

// copyBody copies a non-event body through buf. It returns nil at EOF, a
// *writeError when the client fails, else the read error.
func copyBody(w http.ResponseWriter, wd *watchdog, body io.Reader, buf []byte, firstToken func()) error {
	first := true
	for {
		n, err := body.Read(buf)
		if n > 0 {
			wd.progress(time.Now())
			if first {
				first = false
				firstToken()
			}
			if _, werr := w.Write(buf[:n]); werr != nil {
				return &writeError{werr}
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// maxPendingEvent bounds the bytes of one incomplete event held back; a
// longer event is written through unflushed boundaries.
const maxPendingEvent = 1 << 20

// copyEvents relays a server-sent event stream, writing and flushing only
// whole events (ended by a blank line), so that a stream cut short never
// leaves half an event before the error event. It observes time to first
// token and inter-token latency per flushed write. done reports whether the
// last event relayed was "data: [DONE]" (the stream's normal end). The
// first error event (hasErrorEvent) sets x.streamErr and calls failed.
func (s *Server) copyEvents(x *exchange, wd *watchdog, body io.Reader, buf []byte, firstToken, failed func()) (done bool, err error) {
	rc := http.NewResponseController(x.w)
	var pending []byte
	var last time.Time
	ttft, itl := s.m.ttft.WithLabelValues(x.Req.Model), s.m.itl.WithLabelValues(x.Req.Model)
	for {
		n, rerr := body.Read(buf)
		if n > 0 {
			// One clock read per chunk: the idle clock, and the event's
			// arrival for TTFT/ITL (the write follows within microseconds).
			now := time.Now()
			wd.progress(now)
			chunk := buf[:n]
			if len(pending) > 0 {
				pending = append(pending, chunk...)
				chunk = pending
			}
			end := lastEventEnd(chunk)
			if end == 0 && len(chunk) > maxPendingEvent {
				end = len(chunk)
			}
			if end > 0 {
				done = endsWithDone(chunk[:end]) || x.Req.Kind == request.Responses && endsResponse(chunk[:end])
				x.hit.note(chunk[:end], true)
				if !x.streamErr && hasErrorEvent(chunk[:end]) {
					x.streamErr = true
					failed()
				}
				out := chunk[:end]
				if filter := x.hooks.filter; filter != nil {
					out = filter(out)
				}
				if _, werr := x.w.Write(out); werr != nil {
					return done, &writeError{werr}
				}
				if ferr := rc.Flush(); ferr != nil {
					return done, &writeError{ferr}
				}
				if last.IsZero() {
					firstToken()
					ttft.Observe(now.Sub(x.Start).Seconds())
				} else {
					itl.Observe(now.Sub(last).Seconds())
				}
				last = now
			}
			pending = append(pending[:0], chunk[end:]...)
		}
		if rerr == io.EOF {
			if len(pending) > 0 { // a final event without its blank line
				done = endsWithDone(pending) || x.Req.Kind == request.Responses && endsResponse(pending)
				x.hit.note(pending, true)
				if filter := x.hooks.filter; filter != nil {
					pending = filter(pending)
				}
				if _, werr := x.w.Write(pending); werr != nil {
					return done, &writeError{werr}
				}
			}
			return done, nil
		}
		if rerr != nil {
			return done, rerr
		}
	}
}

// errorData starts the data of an error event: vLLM ends a request that
// fails mid-stream with data: {"error": {...}} (OpenAIServing's
// create_streaming_error_response, json.dumps' separators), then [DONE].
var errorData = []byte(`{"error"`)

// hasErrorEvent reports whether b, whole events, has a line "data:" (with
// its optional space) followed by `{"error"`: an error event's data. A
// string value cannot hold the quotes unescaped, so content never matches.
// It reads each line's first bytes only (newlines found by IndexByte), a
// few ns per event.
func hasErrorEvent(b []byte) bool {
	for len(b) > 0 {
		if line, ok := bytes.CutPrefix(b, dataField); ok {
			if len(line) > 0 && line[0] == ' ' {
				line = line[1:]
			}
			if bytes.HasPrefix(line, errorData) {
				return true
			}
		}
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			return false
		}
		b = b[i+1:]
	}
	return false
}

var dataField = []byte("data:")

// endsWithDone reports whether the last event in b (whole events, or a
// final event without its blank line) is "data: [DONE]" (the space after
// the colon is optional in SSE). It looks at the tail only.
func endsWithDone(b []byte) bool {
	b = bytes.TrimRight(b, "\r\n")
	if !bytes.HasSuffix(b, []byte("[DONE]")) {
		return false
	}
	b = bytes.TrimSuffix(b, []byte("[DONE]"))
	b = bytes.TrimSuffix(b, []byte(" "))
	if !bytes.HasSuffix(b, []byte("data:")) {
		return false
	}
	b = bytes.TrimSuffix(b, []byte("data:"))
	return len(b) == 0 || b[len(b)-1] == '\n'
}

// lastEventEnd returns the index just past the last event terminator
// ("\n\n" or "\r\n\r\n") in b, or 0. It walks back over newlines only,
// so a chunk ending in a whole event (the usual case) costs two byte reads.
func lastEventEnd(b []byte) int {
	for i := len(b); ; {
		j := bytes.LastIndexByte(b[:i], '\n')
		if j < 1 {
			return 0
		}
		if b[j-1] == '\n' || j >= 3 && b[j-1] == '\r' && b[j-2] == '\n' && b[j-3] == '\r' {
			return j + 1
		}
		i = j
	}
}
