package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"kvrouter/internal/vllm"
)

// zmq4 v0.17 (conn.go, Conn.read) allocates every frame body at the size
// its header claims before reading a byte of it, so one 9-byte header
// claiming 2^40 bytes ends the process with "fatal error: runtime: out of
// memory", which no recover catches. zmq4 offers no size option, but the
// subscriber owns the net.Conn it hands to zmq4.Open: limitConn sits between
// the two, follows the ZMTP 3.x framing (RFC 23: a 64-byte greeting, then
// frames of a flags byte, a 1-byte or 8-byte big-endian size and the body),
// and refuses a frame header before zmq4 sees its last byte when the frame
// would take its message past the limit. zmq4 then gets an error wrapping
// errTooLarge instead of the header, and the connection is closed.

// Bounds of SubscriberConfig.MaxMessageBytes (vllm.DefaultMaxMessageBytes,
// vllm.MinMaxMessageBytes, vllm.MaxMaxMessageBytes).
const (
	DefaultMaxMessageBytes = vllm.DefaultMaxMessageBytes
	MinMaxMessageBytes     = vllm.MinMaxMessageBytes
	MaxMaxMessageBytes     = vllm.MaxMaxMessageBytes
)

// maxFramesPerMessage bounds the frames of one ZMTP message (commands
// included). vLLM's messages have at most 4 (a replay reply: delimiter,
// topic, seq, payload); zmq4 keeps a slice header per frame, so a stream of
// empty frames flagged MORE would otherwise grow without bound.
const maxFramesPerMessage = 64

// errTooLarge marks a connection refused by limitConn; the error is a
// *frameLimitError.
var errTooLarge = errors.New("ZMTP message exceeds max_message_bytes")

// frameLimitError says which bound a peer's frame header broke.
type frameLimitError struct {
	frameSize uint64 // size claimed by the refused frame's header
	before    uint64 // body bytes of the same message before that frame
	frames    int    // frames of the message, that one included
	limit     int64  // max_message_bytes
}

func (e *frameLimitError) Error() string {
	if e.frames > maxFramesPerMessage {
		return fmt.Sprintf("%v: message of more than %d frames", errTooLarge, maxFramesPerMessage)
	}
	return fmt.Sprintf("%v: frame of %d bytes after %d bytes of its message, limit %d", errTooLarge, e.frameSize, e.before, e.limit)
}

func (e *frameLimitError) Unwrap() error { return errTooLarge }

// greetingLen is the length of a ZMTP 3.x greeting (RFC 23 §2.3), which
// zmq4 reads whole before the first frame.
const greetingLen = 64

// ZMTP frame flag bits (RFC 23 §2.4).
const (
	flagMore = 0x01
	flagLong = 0x02
)

// limitConn is a net.Conn whose reads stop at the first frame header that
// would take a ZMTP message past limit bytes (sum of its frames' bodies) or
// past maxFramesPerMessage frames. Reads must come from one goroutine at a
// time (zmq4 reads from one); writes and the other methods pass through.
// The refusal is sticky: later reads return the same error. refused, if not
// nil, is called once with it, before the read returns (openZMTP's closes
// the connection).
type limitConn struct {
	net.Conn
	limit   int64
	refused func(err error)

	greet   int     // greeting bytes still to pass through
	pending []byte  // header bytes checked but not yet delivered
	hdr     [9]byte // storage behind pending
	body    uint64  // body bytes of the current frame still to pass through
	more    bool    // the current frame has the MORE flag
	msg     uint64  // body bytes of the current message so far
	frames  int     // frames of the current message so far
	err     error   // sticky refusal
	once    sync.Once
}

// newLimitConn wraps nc; limit must be positive.
func newLimitConn(nc net.Conn, limit int64, refused func(error)) *limitConn {
	return &limitConn{Conn: nc, limit: limit, refused: refused, greet: greetingLen}
}

// Read implements io.Reader over the checked stream.
func (c *limitConn) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	switch {
	case c.greet > 0:
		n, err := c.Conn.Read(p[:min(len(p), c.greet)])
		c.greet -= n
		return n, err
	case len(c.pending) > 0:
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		c.frameDone()
		return n, nil
	case c.body > 0:
		n, err := c.Conn.Read(p[:min(uint64(len(p)), c.body)])
		c.body -= uint64(n)
		c.frameDone()
		return n, err
	}
	if err := c.readHeader(); err != nil {
		return 0, err
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	c.frameDone()
	return n, nil
}

// readHeader reads the next frame header whole into pending and checks it.
func (c *limitConn) readHeader() error {
	if _, err := io.ReadFull(c.Conn, c.hdr[:2]); err != nil {
		return err
	}
	flags, size, n := c.hdr[0], uint64(c.hdr[1]), 2
	if flags&flagLong != 0 {
		if _, err := io.ReadFull(c.Conn, c.hdr[2:9]); err != nil {
			return err
		}
		size, n = binary.BigEndian.Uint64(c.hdr[1:9]), 9
	}
	c.frames++
	if size > uint64(c.limit)-c.msg || c.frames > maxFramesPerMessage { // c.msg <= c.limit
		c.err = &frameLimitError{frameSize: size, before: c.msg, frames: c.frames, limit: c.limit}
		if c.refused != nil {
			c.once.Do(func() { c.refused(c.err) })
		}
		return c.err
	}
	c.msg += size
	c.body = size
	c.more = flags&flagMore != 0
	c.pending = c.hdr[:n]
	return nil
}

// frameDone ends the current message once the header and body of a frame
// without the MORE flag have been delivered.
func (c *limitConn) frameDone() {
	if len(c.pending) > 0 || c.body > 0 {
		return
	}
	if !c.more {
		c.msg, c.frames = 0, 0
	}
}
