package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/testwait"
)

// rawGreeting is a ZMTP 3.0 greeting (RFC 23 §2.3) for the NULL mechanism,
// written byte by byte rather than by zmq4.
func rawGreeting(server bool) []byte {
	g := make([]byte, 0, greetingLen)
	g = append(g, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 0)
	g = append(g, "NULL"...)
	g = append(g, make([]byte, 16)...)
	if server {
		g = append(g, 1)
	} else {
		g = append(g, 0)
	}
	return append(g, make([]byte, 31)...)
}

// rawReady is a READY command (RFC 23 §2.5, RFC 37 §3.2) announcing
// socket type typ.
func rawReady(typ string) []byte {
	body := append([]byte{5}, "READY"...)
	body = append(body, byte(len("Socket-Type")))
	body = append(body, "Socket-Type"...)
	body = binary.BigEndian.AppendUint32(body, uint32(len(typ)))
	body = append(body, typ...)
	return append([]byte{0x04, byte(len(body))}, body...)
}

// hugeHeader is the header of a final long frame claiming 2^40 body bytes.
func hugeHeader() []byte {
	return binary.BigEndian.AppendUint64([]byte{flagLong}, 1<<40)
}

// hostilePeer completes the ZMTP handshake on nc as a typ socket, from raw
// bytes, drains whatever the subscriber sends (its greeting, READY,
// subscription or replay request), and sends hugeHeader. It returns when
// the subscriber has closed the connection, or fails after 10s.
func hostilePeer(t *testing.T, nc net.Conn, typ string, server bool) {
	t.Helper()
	defer nc.Close()
	drained := make(chan struct{})
	go func() { io.Copy(io.Discard, nc); close(drained) }()
	msg := append(append(rawGreeting(server), rawReady(typ)...), hugeHeader()...)
	if _, err := nc.Write(msg); err != nil {
		t.Errorf("hostile peer write: %v", err)
		return
	}
	select {
	case <-drained:
	case <-time.After(10 * time.Second):
		t.Errorf("subscriber kept the connection of a peer that sent a 2^40-byte frame header")
	}
}

// startSubLogged is startSub with a recording logger.
func startSubLogged(t *testing.T, cfg SubscriberConfig) (*runningSub, *recordHandler) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := NewSubscriberMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	h := &recordHandler{}
	s, err := NewSubscriber(cfg, slog.New(h), m)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rs := &runningSub{s: s, reg: reg, ups: make(chan Update, 4096), cancel: cancel, done: make(chan error, 1)}
	go func() { rs.done <- s.Run(ctx, func(u Update) { rs.ups <- u }) }()
	t.Cleanup(func() { rs.stop(t) })
	return rs, h
}

// goodPub completes the handshake on nc as a zmq4 PUB, waits for the
// subscription and publishes testPayload for seqs.
func goodPub(t *testing.T, nc net.Conn, server bool, seqs ...uint64) *zmtpConn {
	t.Helper()
	c, err := openZMTP(context.Background(), nc, zmq4.Pub, server, frameLimit{})
	if err != nil {
		t.Fatalf("publisher handshake: %v", err)
	}
	t.Cleanup(func() { c.close() })
	if _, err := c.recv(); err != nil {
		t.Fatalf("publisher: no subscription: %v", err)
	}
	for _, seq := range seqs {
		if err := c.send(nil, seq8(seq), testPayload(t, 0, seq)); err != nil {
			t.Fatalf("publish seq %d: %v", seq, err)
		}
	}
	return c
}

// checkRefused checks the subscriber counted and logged one refused
// connection on socket.
func checkRefused(t *testing.T, rs *runningSub, logs *recordHandler, engine, socket string) {
	t.Helper()
	testwait.For(t, "oversized message counted", func() bool { return rs.s.Stats().Oversized >= 1 })
	if got := rs.s.Stats().Oversized; got != 1 {
		t.Errorf("Stats().Oversized = %d, want 1", got)
	}
	if got := counterValue(t, rs.s.m.oversized, engine, "0"); got != 1 {
		t.Errorf("kvrouter_vllm_oversized_messages_total = %v, want 1", got)
	}
	r, ok := logs.find("engine connection closed: ZMTP message too large")
	if !ok || r.Level != slog.LevelWarn || r.attr("socket") != socket || r.attr("max_message_bytes") != fmt.Sprint(DefaultMaxMessageBytes) {
		t.Errorf("log %+v (found %v), want a warning with socket %s and max_message_bytes %d", r, ok, socket, DefaultMaxMessageBytes)
	}
}

// TestOversizedFrame: a peer that completes the ZMTP handshake and then
// sends one frame header claiming 2^40 bytes (which zmq4 v0.17 alone
// would allocate, killing the process) has its connection closed, counted
// and logged, on each socket the subscriber reads: the engine's event port
// it dials, the port it binds (events_bind), and the replay port. The
// subscriber goes on serving: it redials, accepts the next engine, or
// treats the failed replay as any other.
func TestOversizedFrame(t *testing.T) {
	t.Run("events", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		rs, logs := startSubLogged(t, SubscriberConfig{Engine: "e-big", Endpoint: "tcp://" + ln.Addr().String()})
		nc, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		hostilePeer(t, nc, "PUB", true)
		checkRefused(t, rs, logs, "e-big", "events")
		nc, err = ln.Accept() // the subscriber redials
		if err != nil {
			t.Fatal(err)
		}
		goodPub(t, nc, true, 0)
		if u := rs.next(t); u.Seq != 0 || u.NoBatch || len(u.Batch.Events) == 0 {
			t.Fatalf("after redial got %+v, want live batch 0", u)
		}
	})
	t.Run("events_bind", func(t *testing.T) {
		port := freePorts(t, 1)
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		rs, logs := startSubLogged(t, SubscriberConfig{Engine: "e-bind", Endpoint: "tcp://" + addr, Bind: true})
		var nc net.Conn
		testwait.For(t, "subscriber listening", func() bool {
			var err error
			nc, err = net.Dial("tcp", addr)
			return err == nil
		})
		hostilePeer(t, nc, "PUB", false)
		checkRefused(t, rs, logs, "e-bind", "events")
		nc, err := net.Dial("tcp", addr) // an engine dials in
		if err != nil {
			t.Fatal(err)
		}
		goodPub(t, nc, false, 0)
		if u := rs.next(t); u.Seq != 0 || u.NoBatch {
			t.Fatalf("after the hostile peer got %+v, want live batch 0", u)
		}
	})
	t.Run("replay", func(t *testing.T) {
		live, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer live.Close()
		rep, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer rep.Close()
		rs, logs := startSubLogged(t, SubscriberConfig{Engine: "e-rep", Endpoint: "tcp://" + live.Addr().String(),
			ReplayEndpoint: "tcp://" + rep.Addr().String(), IdleCheck: -1})
		nc, err := live.Accept()
		if err != nil {
			t.Fatal(err)
		}
		pub := goodPub(t, nc, true) // the connection asks the replay port for the engine's history
		rc, err := rep.Accept()
		if err != nil {
			t.Fatal(err)
		}
		hostilePeer(t, rc, "ROUTER", true)
		checkRefused(t, rs, logs, "e-rep", "replay")
		for seq := range uint64(2) {
			if err := pub.send(nil, seq8(seq), testPayload(t, 0, seq)); err != nil {
				t.Fatal(err)
			}
			if u := rs.next(t); u.Seq != seq || u.NoBatch || u.Replayed {
				t.Fatalf("after the failed replay got %+v, want live batch %d", u, seq)
			}
		}
	})
}

// TestLimitConnBounds: frames up to the limit pass through unchanged; a
// message whose frames add up past it, or with more than
// maxFramesPerMessage frames, is refused at the header that breaks it, and
// the refusal is sticky and reported once.
func TestLimitConnBounds(t *testing.T) {
	frame := func(more bool, n int) []byte {
		var fl byte
		if more {
			fl |= flagMore
		}
		if n > 255 {
			return append(binary.BigEndian.AppendUint64([]byte{fl | flagLong}, uint64(n)), make([]byte, n)...)
		}
		return append([]byte{fl, byte(n)}, make([]byte, n)...)
	}
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	manyEmpty := func(n int) []byte {
		var b []byte
		for i := range n {
			b = append(b, frame(i < n-1, 0)...)
		}
		return b
	}
	const limit = 1000
	for _, tc := range []struct {
		name   string
		stream []byte
		ok     int // bytes delivered before the refusal (len(stream): none)
	}{
		{"frames at the limit", cat(frame(true, 500), frame(false, 500), frame(false, 1000)), -1},
		{"one frame over", cat(frame(false, 10), frame(false, 1001)), 12},
		{"message over", cat(frame(true, 600), frame(false, 401)), 609},
		{"64 frames", manyEmpty(64), -1},
		{"65 frames", manyEmpty(65), 128},
		{"2^64-1", cat(frame(true, 999), []byte{flagLong, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}), 1008},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append(make([]byte, greetingLen), tc.stream...)
			a, b := net.Pipe()
			defer a.Close() // ends the write of what is not read
			go func() { b.Write(in); b.Close() }()
			var refusals int
			lc := newLimitConn(a, limit, func(error) { refusals++ })
			got, err := io.ReadAll(io.LimitReader(readerFunc(func(p []byte) (int, error) { return lc.Read(p[:min(len(p), 7)]) }), int64(len(in))))
			want := len(in)
			if tc.ok >= 0 {
				want = greetingLen + tc.ok
			}
			if !bytes.Equal(got, in[:min(len(got), len(in))]) || len(got) != want {
				t.Fatalf("delivered %d bytes (equal to the input: %v), want the first %d", len(got), bytes.Equal(got, in[:min(len(got), len(in))]), want)
			}
			if tc.ok < 0 {
				if err != nil || refusals != 0 {
					t.Fatalf("err %v, %d refusals, want none", err, refusals)
				}
				return
			}
			if !errors.Is(err, errTooLarge) || refusals != 1 {
				t.Fatalf("err %v, %d refusals; want errTooLarge once", err, refusals)
			}
			if _, err2 := lc.Read(make([]byte, 1)); !errors.Is(err2, errTooLarge) || refusals != 1 {
				t.Fatalf("second read: %v (%d refusals), want the same refusal", err2, refusals)
			}
		})
	}
}

type readerFunc func(p []byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// bytesConn is a net.Conn whose peer sent in and discards what is written.
type bytesConn struct {
	net.Conn // nil: methods not listed here are not used by zmq4.Conn
	in       *bytes.Reader
}

func (c *bytesConn) Read(p []byte) (int, error)  { return c.in.Read(p) }
func (c *bytesConn) Write(p []byte) (int, error) { return len(p), nil }
func (c *bytesConn) Close() error                { return nil }

// FuzzZMTPRecv drives zmq4's frame reader (zmq4.Open's handshake, then
// Conn.RecvMsg until an error) through limitConn with a 1 KiB limit, on
// arbitrary peer bytes: with data[0] odd they follow a valid greeting and
// READY from a PUB, else they are the whole stream. No input may panic,
// and no message zmq4 returns may exceed the limit or the frame count;
// limitConn delivers exactly a prefix of the input.
func FuzzZMTPRecv(f *testing.F) {
	msg := func(frames ...[]byte) []byte {
		var b []byte
		for i, fr := range frames {
			fl := byte(0)
			if i < len(frames)-1 {
				fl = flagMore
			}
			if len(fr) > 255 {
				b = binary.BigEndian.AppendUint64(append(b, fl|flagLong), uint64(len(fr)))
			} else {
				b = append(b, fl, byte(len(fr)))
			}
			b = append(b, fr...)
		}
		return b
	}
	f.Add(append([]byte{1}, msg([]byte("kv"), seq8(7), bytes.Repeat([]byte{0x90}, 300))...))
	f.Add(append([]byte{1}, hugeHeader()...))
	f.Add(append([]byte{1}, msg(make([][]byte, 70)...)...))
	f.Add(append([]byte{1}, 0x04, 5, 4, 'P', 'I', 'N', 'G'))
	f.Add(append(append([]byte{0}, rawGreeting(true)...), rawReady("PUB")...))
	f.Add(append(append(append([]byte{0}, rawGreeting(true)...), 0x06, 0, 0, 0, 0, 0, 0, 0x10, 0), make([]byte, 64)...))
	const limit = 1024
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		in := data[1:]
		if data[0]&1 == 1 {
			in = append(append(rawGreeting(true), rawReady("PUB")...), in...)
		}
		// limitConn alone: what it delivers is a prefix of the input.
		lc := newLimitConn(&bytesConn{in: bytes.NewReader(in)}, limit, nil)
		got, err := io.ReadAll(lc)
		if !bytes.HasPrefix(in, got) {
			t.Fatalf("limitConn delivered %d bytes that are not a prefix of the input", len(got))
		}
		if err != nil && !errors.Is(err, errTooLarge) && !errors.Is(err, io.ErrUnexpectedEOF) { // a header cut short
			t.Fatalf("limitConn: %v", err)
		}
		// zmq4 over it.
		var refused error
		lc = newLimitConn(&bytesConn{in: bytes.NewReader(in)}, limit, func(err error) { refused = err })
		zc, err := openZMQ4(lc, zmq4.Sub, false)
		if err != nil {
			return
		}
		c := &zmtpConn{nc: lc, zc: zc}
		for range 1000 {
			frames, err := c.recv()
			if err != nil {
				if !errors.Is(err, errPeerPanic) && errors.Is(err, errTooLarge) != (refused != nil) {
					t.Fatalf("recv: %v; refused %v", err, refused)
				}
				return
			}
			n := 0
			for _, fr := range frames {
				n += len(fr)
			}
			if n > limit || len(frames) > maxFramesPerMessage {
				t.Fatalf("message of %d frames, %d bytes passed a %d-byte limit", len(frames), n, limit)
			}
		}
	})
}
