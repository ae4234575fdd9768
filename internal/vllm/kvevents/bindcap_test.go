package kvevents

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"kvrouter/internal/testwait"
)

// dialRaw opens a plain TCP connection to the subscriber's bound port and
// reports whether the subscriber kept it (it sends its ZMTP greeting) or
// closed it at once (EOF), or is not listening.
func dialRaw(t *testing.T, port int) (net.Conn, bool) {
	t.Helper()
	c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return nil, false // not listening yet
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var b [1]byte
	_, err = c.Read(b[:])
	c.SetReadDeadline(time.Time{})
	switch {
	case err == nil:
		return c, true
	case errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isReset(err):
		c.Close()
		return nil, false
	}
	c.Close()
	t.Fatalf("read from subscriber: %v", err)
	return nil, false
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && !op.Timeout()
}

// TestSubscriberBindConnCap: in bind mode a rank keeps at most MaxConns
// accepted connections open (here 2 peers that never finish the ZMTP
// handshake); the next one is closed at once and counted, the open ones are
// not disturbed, and once they go away a real engine dials in and its
// batches arrive.
func TestSubscriberBindConnCap(t *testing.T) {
	port := freePorts(t, 1)
	rs := startSub(t, SubscriberConfig{
		Engine: "e-cap", Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", port), Bind: true,
		MaxConns: 2, DialTimeout: time.Minute,
	})
	var idle []net.Conn
	for i := range 2 {
		var c net.Conn
		testwait.For(t, fmt.Sprintf("idle peer %d accepted", i), func() bool {
			var ok bool
			c, ok = dialRaw(t, port)
			return ok
		})
		idle = append(idle, c)
	}
	if _, ok := dialRaw(t, port); ok {
		t.Fatal("third connection kept with max_conns 2")
	}
	testwait.For(t, "rejection counted", func() bool { return rs.s.Stats().RejectedConns == 1 })
	if v := counterValue(t, rs.s.m.rejectedConns, "e-cap", "0"); v != 1 {
		t.Fatalf("kvrouter_vllm_rejected_conns_total = %v, want 1", v)
	}
	// The two idle peers are still connected (their handshake waits).
	for i, c := range idle {
		c.SetWriteDeadline(time.Now().Add(time.Second))
		if _, err := c.Write([]byte{0xff}); err != nil {
			t.Fatalf("idle peer %d: %v", i, err)
		}
		c.Close()
	}
	// Wait until a slot is free again (a kept probe is closed right away).
	testwait.For(t, "a slot free after the idle peers left", func() bool {
		c, ok := dialRaw(t, port)
		if ok {
			c.Close()
		}
		return ok
	})
	g := newGoPub(t, "", port, 1, true)
	g.waitSubscribed()
	g.publish(0, false)
	checkGoUpdate(t, rs.next(t), 0, 0, ResetNone)
}

// TestListenContext: the bind honours Run's context: an ended context binds
// nothing and Run returns nil at once.
func TestListenContext(t *testing.T) {
	port := freePorts(t, 1)
	ep := fmt.Sprintf("tcp://127.0.0.1:%d", port)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	zep, err := parseEndpoint(ep, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	if ln, err := listen(ctx, zep); !errors.Is(err, context.Canceled) {
		if ln != nil {
			ln.Close()
		}
		t.Fatalf("listen(canceled) = %v, want context.Canceled", err)
	}
	s, err := NewSubscriber(SubscriberConfig{Endpoint: ep, Bind: true}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Run(ctx, func(Update) {}); err != nil {
		t.Fatalf("Run(canceled) = %v, want nil", err)
	}
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatalf("port still bound after Run(canceled): %v", err)
	}
	ln.Close()
	if ln, err := listen(context.Background(), zep); err != nil {
		t.Fatalf("listen = %v", err)
	} else {
		ln.Close()
	}
}
