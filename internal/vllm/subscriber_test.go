package vllm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// runningSub is a Subscriber running in the background whose Updates the
// test reads from ups.
type runningSub struct {
	s      *Subscriber
	reg    *prometheus.Registry
	ups    chan Update
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// startSub starts a Subscriber with its own registry; apply pushes into a
// large channel, so the subscriber's queue never fills unless apply is
// given.
func startSub(t *testing.T, cfg SubscriberConfig, apply ...func(Update)) *runningSub {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := NewSubscriberMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	return startSubWith(t, cfg, m, reg, apply...)
}

func startSubWith(t *testing.T, cfg SubscriberConfig, m *SubscriberMetrics, reg *prometheus.Registry, apply ...func(Update)) *runningSub {
	t.Helper()
	s, err := NewSubscriber(cfg, testLogger(t), m)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rs := &runningSub{s: s, reg: reg, ups: make(chan Update, 4096), cancel: cancel, done: make(chan error, 1)}
	fn := func(u Update) { rs.ups <- u }
	if len(apply) > 0 {
		fn = apply[0]
	}
	go func() { rs.done <- s.Run(ctx, fn) }()
	t.Cleanup(func() { rs.stop(t) })
	return rs
}

// stop cancels Run and waits for it (idempotent); it fails the test if Run
// does not return within 10s or returns an error.
func (rs *runningSub) stop(t *testing.T) {
	t.Helper()
	rs.once.Do(func() {
		rs.cancel()
		select {
		case rs.err = <-rs.done:
		case <-time.After(10 * time.Second):
			rs.err = errors.New("Run did not return within 10s of cancel")
		}
	})
	if rs.err != nil {
		t.Fatalf("Run: %v", rs.err)
	}
}

func (rs *runningSub) tryNext(d time.Duration) (Update, bool) {
	select {
	case u := <-rs.ups:
		return u, true
	case <-time.After(d):
		return Update{}, false
	}
}

func (rs *runningSub) next(t *testing.T) Update {
	t.Helper()
	u, ok := rs.tryNext(10 * time.Second)
	if !ok {
		t.Fatalf("no update within 10s; stats %+v", rs.s.Stats())
	}
	return u
}

// none asserts that no further Update arrives within 150ms.
func (rs *runningSub) none(t *testing.T) {
	t.Helper()
	if u, ok := rs.tryNext(150 * time.Millisecond); ok {
		t.Fatalf("unexpected update seq=%d reset=%v replayed=%v", u.Seq, u.Reset, u.Replayed)
	}
}

// waitFor polls cond every 5ms for up to 10s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func counterValue(t *testing.T, v *prometheus.CounterVec, labels ...string) float64 {
	t.Helper()
	return testutil.ToFloat64(v.WithLabelValues(labels...))
}

// freePorts returns a base port p such that p..p+n-1 are free on 127.0.0.1.
func freePorts(t *testing.T, n int) int {
	t.Helper()
	for range 50 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		base := ln.Addr().(*net.TCPAddr).Port
		held := []net.Listener{ln}
		ok := true
		for i := 1; i < n && ok; i++ {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(base+i))
			if err != nil {
				ok = false
				break
			}
			held = append(held, l)
		}
		for _, l := range held {
			l.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatal("no free port range")
	return 0
}

// goPub is an in-process engine: zmq4 PUB (and optionally ROUTER) sockets
// publishing batches encoded by AppendBatch, one PUB per rank.
type goPub struct {
	t     *testing.T
	topic string
	pubs  []zmq4.Socket
	seq   []uint64
}

// newGoPub binds (dial == false) or dials (dial == true) one PUB per rank at
// base+rank on 127.0.0.1.
func newGoPub(t *testing.T, topic string, base, ranks int, dial bool) *goPub {
	t.Helper()
	g := &goPub{t: t, topic: topic, seq: make([]uint64, ranks)}
	for r := range ranks {
		p := zmq4.NewPub(context.Background())
		ep := fmt.Sprintf("tcp://127.0.0.1:%d", base+r)
		var err error
		if dial {
			err = p.Dial(ep)
		} else {
			err = p.Listen(ep)
		}
		if err != nil {
			t.Fatalf("pub rank %d: %v", r, err)
		}
		g.pubs = append(g.pubs, p)
	}
	t.Cleanup(g.close)
	return g
}

func (g *goPub) close() {
	for _, p := range g.pubs {
		p.Close()
	}
	g.pubs = nil
}

// waitSubscribed waits until every PUB has a subscriber for the topic.
func (g *goPub) waitSubscribed() {
	g.t.Helper()
	for r, p := range g.pubs {
		waitFor(g.t, fmt.Sprintf("subscription on rank %d", r), func() bool {
			for _, tp := range p.(zmq4.Topics).Topics() {
				if strings.HasPrefix(g.topic, tp) {
					return true
				}
			}
			return false
		})
	}
}

// testBatch is the batch goPub sends for (rank, seq): one BlockStored of
// two blocks whose hashes encode rank and seq.
func testBatch(rank int, seq uint64) Batch {
	return Batch{
		TS:               1754530955 + float64(seq),
		DataParallelRank: rank,
		Events: []Event{{
			Type:        BlockStored,
			BlockHashes: []BlockHash{BlockHash(uint64(rank)<<32 | seq<<1), BlockHash(uint64(rank)<<32 | seq<<1 | 1)},
			TokenIDs:    []uint32{1, 2, 3, 4, 5, 6, 7, 8}, BlockSize: 4, Medium: "GPU",
		}},
	}
}

func testPayload(t *testing.T, rank int, seq uint64) []byte {
	t.Helper()
	b := testBatch(rank, seq)
	p, err := AppendBatch(nil, &b, LayoutMap)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func seq8(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// publish sends the batch for the rank's next seq, or skips it when skip.
func (g *goPub) publish(rank int, skip bool) uint64 {
	g.t.Helper()
	seq := g.seq[rank]
	g.seq[rank]++
	if skip {
		return seq
	}
	msg := zmq4.NewMsgFrom([]byte(g.topic), seq8(seq), testPayload(g.t, rank, seq))
	if err := g.pubs[rank].Send(msg); err != nil {
		g.t.Fatalf("publish rank %d seq %d: %v", rank, seq, err)
	}
	return seq
}

func checkGoUpdate(t *testing.T, u Update, rank int, seq uint64, reset ResetReason) {
	t.Helper()
	if u.Rank != rank || u.Seq != seq || u.Reset != reset {
		t.Fatalf("update rank=%d seq=%d reset=%v, want rank=%d seq=%d reset=%v", u.Rank, u.Seq, u.Reset, rank, seq, reset)
	}
	want := testBatch(rank, seq)
	if u.Batch.DataParallelRank != rank || u.Batch.TS != want.TS || len(u.Batch.Events) != 1 ||
		diffEvent(u.Batch.Events[0], want.Events[0]) != "" {
		t.Fatalf("rank %d seq %d: batch %+v, want %+v", rank, seq, u.Batch, want)
	}
}
