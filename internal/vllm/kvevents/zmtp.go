package kvevents

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
)

// The subscriber speaks ZMTP through zmq4's connection layer (zmq4.Open on a
// net.Conn it owns) rather than through zmq4's sockets: it then decides when
// to dial, redial and close, and every goroutine it starts ends when the
// net.Conn is closed. zmq4 v0.17's socket types start internal goroutines
// that can block forever on a full internal queue once the socket is closed.

// zmtpEndpoint is a parsed ZeroMQ endpoint: "tcp://host:port" or
// "ipc:///path". inproc endpoints only exist inside a libzmq process, so a
// router in another process cannot reach them; they are rejected.
type zmtpEndpoint struct {
	network string // "tcp" or "unix"
	addr    string // host:port or path
}

// parseEndpoint parses a ZeroMQ endpoint and applies vLLM's data-parallel
// offset (vllm/distributed/kv_events.py offset_endpoint_port): rank r adds r
// to a tcp port; an ipc endpoint cannot be offset (vLLM raises ValueError
// for rank > 0). For a bind, host "*" means all interfaces; for a dial it is
// an error.
func parseEndpoint(ep string, rank int, bind bool) (zmtpEndpoint, error) {
	scheme, rest, ok := strings.Cut(ep, "://")
	if !ok || rest == "" {
		return zmtpEndpoint{}, fmt.Errorf("endpoint %q: want tcp://HOST:PORT or ipc://PATH", ep)
	}
	switch scheme {
	case "tcp":
		host, port, err := net.SplitHostPort(rest)
		if err != nil {
			return zmtpEndpoint{}, fmt.Errorf("endpoint %q: %w", ep, err)
		}
		p, err := strconv.ParseUint(port, 10, 16)
		if err != nil {
			return zmtpEndpoint{}, fmt.Errorf("endpoint %q: bad port: %w", ep, err)
		}
		if p+uint64(rank) > 65535 {
			return zmtpEndpoint{}, fmt.Errorf("endpoint %q: port %d + rank %d exceeds 65535", ep, p, rank)
		}
		if host == "*" {
			if !bind {
				return zmtpEndpoint{}, fmt.Errorf("endpoint %q: cannot dial host \"*\"; name the engine's host", ep)
			}
			host = ""
		}
		return zmtpEndpoint{"tcp", net.JoinHostPort(host, strconv.FormatUint(p+uint64(rank), 10))}, nil
	case "ipc":
		if rank > 0 {
			return zmtpEndpoint{}, fmt.Errorf("endpoint %q: ipc endpoints cannot be offset for data-parallel rank %d (vLLM rejects this too)", ep, rank)
		}
		return zmtpEndpoint{"unix", rest}, nil
	case "inproc":
		return zmtpEndpoint{}, fmt.Errorf("endpoint %q: inproc endpoints are private to the engine process", ep)
	}
	return zmtpEndpoint{}, fmt.Errorf("endpoint %q: unsupported transport %q", ep, scheme)
}

// rankEndpoint returns the endpoint string rank r of a data-parallel engine
// uses: the tcp port plus r, or for inproc the "_dp{r}" suffix vLLM appends.
// It is what the subscriber logs and reports; ipc is returned unchanged.
func rankEndpoint(ep string, rank int) string {
	if rank == 0 {
		return ep
	}
	scheme, rest, _ := strings.Cut(ep, "://")
	switch scheme {
	case "tcp":
		host, port, err := net.SplitHostPort(rest)
		if err != nil {
			return ep
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			return ep
		}
		return "tcp://" + net.JoinHostPort(host, strconv.Itoa(p+rank))
	case "inproc":
		return fmt.Sprintf("%s_dp%d", ep, rank)
	}
	return ep
}

// zmtpConn is one ZMTP session over a net.Conn the caller owns. Close the
// net.Conn to end it; RecvMsg then returns an error.
type zmtpConn struct {
	nc net.Conn
	zc *zmq4.Conn
}

// frameLimit bounds what a connection may read (framelimit.go): max bytes
// per ZMTP message (0: no bound); refused, if not nil, is told once when a
// peer exceeds it, with the peer's address.
type frameLimit struct {
	max     int64
	refused func(remote string, err error)
}

// openZMTP performs the ZMTP 3.0 greeting and NULL handshake as a socket of
// type typ on nc, reading through a limitConn when lim.max > 0 (from the
// greeting on, so the handshake's commands are bounded too). The handshake
// is bounded by ctx.
func openZMTP(ctx context.Context, nc net.Conn, typ zmq4.SocketType, server bool, lim frameLimit) (*zmtpConn, error) {
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	defer stop()
	var rw net.Conn = nc
	if lim.max > 0 {
		remote := nc.RemoteAddr().String()
		rw = newLimitConn(nc, lim.max, func(err error) {
			nc.Close()
			if lim.refused != nil {
				lim.refused(remote, err)
			}
		})
	}
	zc, err := openZMQ4(rw, typ, server)
	if err != nil {
		nc.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	return &zmtpConn{nc: nc, zc: zc}, nil
}

// errPeerPanic marks a peer's bytes that made zmq4 panic (a malformed
// handshake command, for example: zmq4 v0.17.0's metadata parser slices
// past a property's end); the connection is closed as malformed.
var errPeerPanic = errors.New("zmq4 panicked on the peer's bytes")

// openZMQ4 is zmq4.Open with the NULL mechanism, a panic inside it turned
// into an error wrapping errPeerPanic.
func openZMQ4(rw net.Conn, typ zmq4.SocketType, server bool) (zc *zmq4.Conn, err error) {
	defer func() {
		if p := recover(); p != nil {
			zc, err = nil, fmt.Errorf("zmtp handshake: %w: %v", errPeerPanic, p)
		}
	}()
	return zmq4.Open(rw, null.Security(), typ, nil, server, nil)
}

// dialZMTP dials ep and opens a ZMTP session as typ, bounded by lim.
func dialZMTP(ctx context.Context, ep zmtpEndpoint, typ zmq4.SocketType, lim frameLimit) (*zmtpConn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, ep.network, ep.addr)
	if err != nil {
		return nil, err
	}
	return openZMTP(ctx, nc, typ, false, lim)
}

// recv returns the next user message, answering and skipping ZMTP commands
// (PING is answered by zmq4 itself).
func (c *zmtpConn) recv() (frames [][]byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			frames, err = nil, fmt.Errorf("zmtp recv: %w: %v", errPeerPanic, p)
		}
	}()
	for {
		msg, err := c.zc.RecvMsg()
		if err != nil {
			return nil, err
		}
		if msg.Type == zmq4.CmdMsg {
			continue
		}
		return msg.Frames, nil
	}
}

// send writes one multipart message.
func (c *zmtpConn) send(frames ...[]byte) error {
	return c.zc.SendMsg(zmq4.NewMsgFrom(frames...))
}

// subscribe sends a SUB subscription for the topic prefix (ZMTP 3.0 form: a
// one-frame message 0x01 + prefix, which libzmq 4.x accepts from any peer).
func (c *zmtpConn) subscribe(prefix string) error {
	return c.send(append([]byte{1}, prefix...))
}

// close closes the underlying connection.
func (c *zmtpConn) close() error {
	err := c.nc.Close()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// listen binds ep for engines to dial in (bind mode). A ctx that has
// already ended binds nothing.
func listen(ctx context.Context, ep zmtpEndpoint) (net.Listener, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("bind %s: %w", ep.addr, err)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, ep.network, ep.addr)
	if err != nil {
		return nil, fmt.Errorf("bind %s: %w", ep.addr, err)
	}
	return ln, nil
}
