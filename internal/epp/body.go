package epp

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/bodybudget"
)

// Body assembly errors.
var (
	// errBodyTooLarge: the chunks passed the limit.
	errBodyTooLarge = errors.New("request body over the limit")
	// errBodyAfterEnd: a chunk came after the end of stream.
	errBodyAfterEnd = errors.New("request body chunk after end of stream")
	// errBodyBudget: the bodies all streams hold would pass the budget.
	errBodyBudget = errors.New("request bodies held past the budget")
)

// assembler joins a request body's chunks, at most limit bytes, each
// byte taken from budget (when not nil) and counted in held (when not
// nil) until release. Not safe for
// concurrent use (one stream owns it).
type assembler struct {
	limit  int64
	budget *bodybudget.Budget
	gauge  prometheus.Gauge
	held   int64 // taken from budget
	buf    []byte
	done   bool
}

// add appends chunk; end marks the last one. Past the limit it returns
// errBodyTooLarge, past the budget errBodyBudget, and either way drops
// what it held; after the end, errBodyAfterEnd.
func (a *assembler) add(chunk []byte, end bool) error {
	if a.done {
		return errBodyAfterEnd
	}
	if int64(len(a.buf))+int64(len(chunk)) > a.limit {
		a.buf, a.done = nil, true
		a.release()
		return errBodyTooLarge
	}
	if a.budget != nil && len(chunk) > 0 {
		if !a.budget.Take(int64(len(chunk))) {
			a.buf, a.done = nil, true
			a.release()
			return errBodyBudget
		}
		a.held += int64(len(chunk))
		if a.gauge != nil {
			a.gauge.Add(float64(len(chunk)))
		}
	}
	a.buf = append(a.buf, chunk...)
	a.done = end
	return nil
}

// release gives back what the body took from the budget; the stream
// calls it when it ends (the pick may keep the body until then).
func (a *assembler) release() {
	if a.budget != nil && a.held != 0 {
		a.budget.Give(a.held)
		if a.gauge != nil {
			a.gauge.Sub(float64(a.held))
		}
	}
	a.held = 0
}

// finish marks the body complete (the request trailers came) and returns
// it; false when it was complete already.
func (a *assembler) finish() ([]byte, bool) {
	if a.done {
		return a.buf, false
	}
	a.done = true
	return a.buf, true
}

// chunkSize is the largest body chunk sent back to the gateway: the
// upstream EPP's limit (pkg/common/envoy/chunking.go BodyByteLimit), under
// the 64 KiB some Envoy builds accept per streamed chunk.
const chunkSize = 62000

// chunks splits b into pieces of at most chunkSize bytes; an empty b is
// one empty piece (the end of stream must still be sent).
func chunks(b []byte) [][]byte {
	if len(b) == 0 {
		return [][]byte{nil}
	}
	out := make([][]byte, 0, (len(b)+chunkSize-1)/chunkSize)
	for len(b) > 0 {
		n := min(len(b), chunkSize)
		out = append(out, b[:n])
		b = b[n:]
	}
	return out
}
