package epp

import "errors"

// Body assembly errors.
var (
	// errBodyTooLarge: the chunks passed the limit.
	errBodyTooLarge = errors.New("request body over the limit")
	// errBodyAfterEnd: a chunk came after the end of stream.
	errBodyAfterEnd = errors.New("request body chunk after end of stream")
)

// assembler joins a request body's chunks, at most limit bytes. Not safe
// for concurrent use (one stream owns it).
type assembler struct {
	limit int64
	buf   []byte
	done  bool
}

// add appends chunk; end marks the last one. Past the limit it returns
// errBodyTooLarge and drops what it held; after the end, errBodyAfterEnd.
func (a *assembler) add(chunk []byte, end bool) error {
	if a.done {
		return errBodyAfterEnd
	}
	if int64(len(a.buf))+int64(len(chunk)) > a.limit {
		a.buf, a.done = nil, true
		return errBodyTooLarge
	}
	a.buf = append(a.buf, chunk...)
	a.done = end
	return nil
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
