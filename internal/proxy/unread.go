package proxy

import (
	"io"
	"net/http"
	"sync/atomic"
	"time"
)

// An answer that leaves a request body unread (any refusal before or
// while the body is read, a route that takes no body, a reserved
// connection's 503) ends the connection at once. Left alone, net/http
// reads up to 256 KiB of the unread body, when the answer's headers are
// written and again after the handler, with no read deadline: a client
// that declares a body and sends none would hold the connection, and the
// answer, for ever. closeUnread makes such an answer carry
// "Connection: close" and moves the connection's read deadline to now
// before net/http's discard, which then fails at once, so the connection
// closes after the answer (docs/security.md, "HTTP listener").

// closeUnread wraps h (the whole listener's handler) so that every answer
// to a request whose body has not been read to its end closes the
// connection.
func closeUnread(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
			h.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		b := &trackedBody{ReadCloser: r.Body, declared: r.ContentLength, rc: rc}
		r.Body = b
		g := &unreadWriter{ResponseWriter: w, body: b}
		h.ServeHTTP(g, r)
		if !b.done() {
			if !g.wrote.Load() {
				w.Header().Set("Connection", "close")
			}
			b.stop()
		}
	})
}

// trackedBody is a request body that knows whether it was read to its
// end. Safe for one reader and concurrent done calls.
type trackedBody struct {
	io.ReadCloser
	declared int64 // Content-Length, -1: unknown
	read     atomic.Int64
	eof      atomic.Bool
	rc       *http.ResponseController
}

func (b *trackedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.read.Add(int64(n))
	if err == io.EOF {
		b.eof.Store(true)
	}
	return n, err
}

// Close stops the connection's reads first when the body is not read
// to its end: net/http's Close would otherwise wait for the rest.
func (b *trackedBody) Close() error {
	if !b.done() {
		b.stop()
	}
	return b.ReadCloser.Close()
}

// done reports whether the body was read to its end.
func (b *trackedBody) done() bool {
	return b.eof.Load() || b.declared >= 0 && b.read.Load() >= b.declared
}

// stop ends the connection's reads (a read deadline of now).
func (b *trackedBody) stop() { _ = b.rc.SetReadDeadline(time.Now()) }

// unreadWriter is the ResponseWriter of closeUnread: the first answer
// written while the body is unread carries "Connection: close" and stops
// the connection's reads before net/http's discard.
type unreadWriter struct {
	http.ResponseWriter
	body  *trackedBody
	wrote atomic.Bool
}

// answer runs before the answer's headers are written.
func (u *unreadWriter) answer() {
	if u.wrote.Swap(true) || u.body.done() {
		return
	}
	u.Header().Set("Connection", "close")
	u.body.stop()
}

func (u *unreadWriter) WriteHeader(code int) {
	if code >= 200 {
		u.answer()
	}
	u.ResponseWriter.WriteHeader(code)
}

func (u *unreadWriter) Write(p []byte) (int, error) {
	u.answer()
	return u.ResponseWriter.Write(p)
}

// Flush flushes the answer (http.Flusher; http.ResponseController finds
// it first).
func (u *unreadWriter) Flush() {
	u.answer()
	_ = http.NewResponseController(u.ResponseWriter).Flush()
}

// Unwrap returns the wrapped writer (http.ResponseController's deadlines).
func (u *unreadWriter) Unwrap() http.ResponseWriter { return u.ResponseWriter }
