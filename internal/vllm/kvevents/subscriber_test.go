package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"kvrouter/internal/vllm"
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

	"kvrouter/internal/testwait"
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

func counterValue(t *testing.T, v *prometheus.CounterVec, labels ...string) float64 {
	t.Helper()
	return testutil.ToFloat64(v.WithLabelValues(labels...))
}

// freePorts returns a base port p such that p..p+n-1 are free on 127.0.0.1.
func freePorts(t testing.TB, n int) int {
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
		testwait.For(g.t, fmt.Sprintf("subscription on rank %d", r), func() bool {
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
func testBatch(rank int, seq uint64) vllm.Batch {
	return vllm.Batch{
		TS:               1754530955 + float64(seq),
		DataParallelRank: rank,
		Events: []vllm.Event{{
			Type:        vllm.BlockStored,
			BlockHashes: []vllm.BlockHash{vllm.BlockHash(uint64(rank)<<32 | seq<<1), vllm.BlockHash(uint64(rank)<<32 | seq<<1 | 1)},
			TokenIDs:    []uint32{1, 2, 3, 4, 5, 6, 7, 8}, BlockSize: 4, Medium: "GPU",
		}},
	}
}

func testPayload(t *testing.T, rank int, seq uint64) []byte {
	t.Helper()
	b := testBatch(rank, seq)
	p, err := vllm.AppendBatch(nil, &b, vllm.LayoutMap)
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

// TestSubscriberBindModeDPRanks: the router binds port and port+1 (bind
// mode, two data-parallel ranks); a zmq4 PUB per rank dials in. Each rank's
// batches arrive in order with their rank, and a skipped seq without a
// replay endpoint is an unrecoverable gap on that rank only.
func TestSubscriberBindModeDPRanks(t *testing.T) {
	base := freePorts(t, 2)
	rs := startSub(t, SubscriberConfig{
		Engine: "e-bind", Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base), Topic: "kv", DPSize: 2, Bind: true,
	})
	if rs.s.Connected() {
		t.Fatal("Connected() true before any engine rank dialled in")
	}
	g := newGoPub(t, "kv-events", base, 2, true)
	g.waitSubscribed()
	for range 3 {
		g.publish(0, false)
		g.publish(1, false)
	}
	got := map[int][]uint64{}
	for range 6 {
		u := rs.next(t)
		checkGoUpdate(t, u, u.Rank, uint64(len(got[u.Rank])), ResetNone)
		got[u.Rank] = append(got[u.Rank], u.Seq)
	}
	g.publish(1, true) // seq 3 on rank 1 is lost
	g.publish(1, false)
	checkGoUpdate(t, rs.next(t), 1, 4, ResetGapLost)
	g.publish(0, false)
	checkGoUpdate(t, rs.next(t), 0, 3, ResetNone)
	rs.none(t)
	m := rs.s.m
	if v := counterValue(t, m.unrecoverable, "e-bind", "1"); v != 1 {
		t.Fatalf("unrecoverable rank 1 = %v", v)
	}
	if v := counterValue(t, m.unrecoverable, "e-bind", "0"); v != 0 {
		t.Fatalf("unrecoverable rank 0 = %v", v)
	}
	if v := testutil.ToFloat64(m.connected.WithLabelValues("e-bind", "1")); v != 1 {
		t.Fatalf("connected rank 1 = %v", v)
	}
	if !rs.s.Connected() {
		t.Fatal("Connected() false with both ranks connected")
	}
	st := rs.s.Stats()
	if st.Batches != 8 || st.BlocksStored != 16 || st.Events != 8 || st.Gaps != 1 || st.Replays != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestSubscriberConnectModeDPRanks: connect mode with two ranks, each
// engine rank's PUB bound at port+rank.
func TestSubscriberConnectModeDPRanks(t *testing.T) {
	base := freePorts(t, 2)
	g := newGoPub(t, "", base, 2, false)
	rs := startSub(t, SubscriberConfig{Engine: "e-dp", Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base), DPSize: 2})
	g.waitSubscribed()
	g.publish(1, false)
	checkGoUpdate(t, rs.next(t), 1, 0, ResetNone)
	g.publish(0, false)
	checkGoUpdate(t, rs.next(t), 0, 0, ResetNone)
	rs.none(t)
}

// TestSubscriberOverflow: without a replay endpoint, a consumer that blocks
// makes the bounded queue overflow; the reader keeps going, counts the
// drops, and the next Update that gets through carries ResetOverflow. Only
// the batches handed on count in batches.
func TestSubscriberOverflow(t *testing.T) {
	base := freePorts(t, 1)
	g := newGoPub(t, "", base, 1, false)
	release := make(chan struct{})
	var mu sync.Mutex
	var got []Update
	first := make(chan struct{})
	var firstOnce sync.Once
	rs := startSub(t, SubscriberConfig{Engine: "e-slow", Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base), QueueSize: 2},
		func(u Update) {
			mu.Lock()
			got = append(got, u)
			mu.Unlock()
			firstOnce.Do(func() { close(first); <-release })
		})
	g.waitSubscribed()
	g.publish(0, false)
	<-first // apply holds seq 0
	for range 9 {
		g.publish(0, false) // 1, 2 queue; 3..9 dropped
	}
	testwait.For(t, "7 queue drops", func() bool { return rs.s.Stats().QueueDrops == 7 })
	close(release)
	g.publish(0, false) // 10
	g.publish(0, false) // 11
	testwait.For(t, "5 updates", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 5 })
	rs.stop(t)
	want := []struct {
		seq   uint64
		reset ResetReason
	}{{0, ResetNone}, {1, ResetNone}, {2, ResetNone}, {10, ResetOverflow}, {11, ResetNone}}
	for i, w := range want {
		checkGoUpdate(t, got[i], 0, w.seq, w.reset)
	}
	if st := rs.s.Stats(); st.QueueDrops != 7 || st.Batches != 5 || st.Gaps != 0 || st.OverflowResets != 1 || st.QueueRecovered != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestSubscriberLagAndLabels: lag uses the injected clock; several
// subscribers share one registry; a stopped subscriber's series are gone.
func TestSubscriberLagAndLabels(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewSubscriberMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewSubscriberMetrics(reg); err == nil {
		t.Fatal("second NewSubscriberMetrics on one registry succeeded")
	}
	base := freePorts(t, 2)
	ga := newGoPub(t, "", base, 1, false)
	gb := newGoPub(t, "", base+1, 1, false)
	now := func() time.Time { return time.Unix(1754530955, 250_000_000) } // seq 0's ts + 0.25s
	a := startSubWith(t, SubscriberConfig{Engine: "a", Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base), Now: now}, m, reg)
	b := startSubWith(t, SubscriberConfig{Engine: "b", Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base+1), Now: now}, m, reg)
	ga.waitSubscribed()
	gb.waitSubscribed()
	ga.publish(0, false)
	gb.publish(0, false)
	a.next(t)
	b.next(t)
	if n := testutil.CollectAndCount(m.batches); n != 2 {
		t.Fatalf("%d batches series, want 2 (engines a and b)", n)
	}
	const want = `
# HELP kvrouter_vllm_lag_seconds Receive time minus the batch timestamp of live KV event batches.
# TYPE kvrouter_vllm_lag_seconds histogram
kvrouter_vllm_lag_seconds_bucket{engine="a",rank="0",le="0.001"} 0
kvrouter_vllm_lag_seconds_bucket{engine="a",rank="0",le="0.0025"} 0
kvrouter_vllm_lag_seconds_bucket{engine="a",rank="0",le="0.005"} 0
kvrouter_vllm_lag_seconds_bucket{engine="a",rank="0",le="0.01"} 0
kvrouter_vllm_lag_seconds_bucket{engine="a",rank="0",le="0.025"} 0
kvrouter_vllm_lag_seconds_bucket{engine="a",rank="0",le="0.05"} 0
kvrouter_vllm_lag_seconds_bucket{engine="a",rank="0",le="0.1"} 0
kvrouter_vllm_lag_seconds_bucket{engine="a",rank="0",le="0.25"} 1
kvrouter_vllm_lag_seconds_bucket{engine="a",rank="0",le="0.5"} 1
kvrouter_vllm_lag_seconds_bucket{engine="a",rank="0",le="1"} 1
kvrouter_vllm_lag_seconds_bucket{engine="a",rank="0",le="2.5"} 1
kvrouter_vllm_lag_seconds_bucket{engine="a",rank="0",le="5"} 1
kvrouter_vllm_lag_seconds_bucket{engine="a",rank="0",le="10"} 1
kvrouter_vllm_lag_seconds_bucket{engine="a",rank="0",le="30"} 1
kvrouter_vllm_lag_seconds_bucket{engine="a",rank="0",le="+Inf"} 1
kvrouter_vllm_lag_seconds_sum{engine="a",rank="0"} 0.25
kvrouter_vllm_lag_seconds_count{engine="a",rank="0"} 1
`
	b.stop(t)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kvrouter_vllm_lag_seconds"); err != nil {
		t.Fatal(err)
	}
	a.stop(t)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if len(mf.GetMetric()) > 0 {
			t.Fatalf("%s still has %d series after every subscriber stopped", mf.GetName(), len(mf.GetMetric()))
		}
	}
}

// TestSubscriberApplyPanic: a panic in apply ends Run with an error.
func TestSubscriberApplyPanic(t *testing.T) {
	base := freePorts(t, 1)
	g := newGoPub(t, "", base, 1, false)
	s, err := NewSubscriber(SubscriberConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base)}, testLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background(), func(Update) { panic("consumer bug") }) }()
	g.waitSubscribed()
	g.publish(0, false)
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "consumer bug") {
			t.Fatalf("Run = %v, want the panic as an error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after apply panicked")
	}
	if err := s.Run(context.Background(), func(Update) {}); err == nil {
		t.Fatal("second Run succeeded")
	}
}

// TestSubscriberBindFails: a port already in use fails Run at once.
func TestSubscriberBindFails(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	s, err := NewSubscriber(SubscriberConfig{Endpoint: "tcp://" + ln.Addr().String(), Bind: true}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Run(context.Background(), func(Update) {}); err == nil || !strings.Contains(err.Error(), "bind") {
		t.Fatalf("Run = %v, want a bind error", err)
	}
}

func TestNewSubscriberConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  SubscriberConfig
		want []string // substrings of the error; none = valid
	}{
		{"defaults", SubscriberConfig{Endpoint: "tcp://engine:5557"}, nil},
		{"dp and replay", SubscriberConfig{Endpoint: "tcp://engine:5557", ReplayEndpoint: "tcp://engine:5558", DPSize: 4}, nil},
		{"bind all interfaces", SubscriberConfig{Endpoint: "tcp://*:5557", Bind: true}, nil},
		{"ipc", SubscriberConfig{Endpoint: "ipc:///tmp/kv.sock"}, nil},
		{"all problems at once", SubscriberConfig{DPSize: -1, QueueSize: -1}, []string{"endpoint is required", "dp_size -1", "queue_size -1"}},
		{"dial star", SubscriberConfig{Endpoint: "tcp://*:5557"}, []string{`cannot dial host "*"`}},
		{"bad port", SubscriberConfig{Endpoint: "tcp://engine:x"}, []string{"bad port"}},
		{"port overflow", SubscriberConfig{Endpoint: "tcp://engine:65535", DPSize: 2}, []string{"exceeds 65535"}},
		{"ipc with dp", SubscriberConfig{Endpoint: "ipc:///tmp/kv.sock", DPSize: 2}, []string{"ipc endpoints cannot be offset"}},
		{"inproc", SubscriberConfig{Endpoint: "inproc://kv"}, []string{"private to the engine process"}},
		{"replay star", SubscriberConfig{Endpoint: "tcp://e:1", ReplayEndpoint: "tcp://*:2"}, []string{"replay endpoint"}},
		{"no scheme", SubscriberConfig{Endpoint: "engine:5557"}, []string{"want tcp://HOST:PORT"}},
		{"backoff", SubscriberConfig{Endpoint: "tcp://e:1", ReconnectMin: time.Second, ReconnectMax: time.Millisecond}, []string{"reconnect_max"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := NewSubscriber(tt.cfg, nil, nil)
			if len(tt.want) == 0 {
				if err != nil || s == nil {
					t.Fatalf("NewSubscriber = %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("NewSubscriber succeeded")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestEndpoints(t *testing.T) {
	tests := []struct {
		ep         string
		rank       int
		bind       bool
		network    string
		addr, full string
	}{
		{"tcp://127.0.0.1:46557", 1, false, "tcp", "127.0.0.1:46558", "tcp://127.0.0.1:46558"},
		{"tcp://127.0.0.1:46657", 0, false, "tcp", "127.0.0.1:46657", "tcp://127.0.0.1:46657"},
		{"tcp://*:5557", 3, true, "tcp", ":5560", "tcp://*:5560"},
		{"tcp://[::1]:5557", 2, false, "tcp", "[::1]:5559", "tcp://[::1]:5559"},
		{"ipc:///tmp/x", 0, false, "unix", "/tmp/x", "ipc:///tmp/x"},
	}
	for _, tt := range tests {
		got, err := parseEndpoint(tt.ep, tt.rank, tt.bind)
		if err != nil || got.network != tt.network || got.addr != tt.addr {
			t.Errorf("parseEndpoint(%q, %d) = %+v, %v; want %s %s", tt.ep, tt.rank, got, err, tt.network, tt.addr)
		}
		if r := rankEndpoint(tt.ep, tt.rank); r != tt.full {
			t.Errorf("rankEndpoint(%q, %d) = %q, want %q", tt.ep, tt.rank, r, tt.full)
		}
	}
	// vLLM's offset_endpoint_port for inproc (frames.md §1).
	if r := rankEndpoint("inproc://x", 1); r != "inproc://x_dp1" {
		t.Errorf("inproc rank 1 = %q", r)
	}
}

// TestSubscriberMalformed: a message of the wrong shape is skipped (its
// seq is unknown; nothing is lost yet); an undecodable payload at a known
// seq is a lost batch, so the next Update carries ResetGapLost.
func TestSubscriberMalformed(t *testing.T) {
	base := freePorts(t, 1)
	g := newGoPub(t, "", base, 1, false)
	rs := startSub(t, SubscriberConfig{Engine: "e-bad", Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base)})
	g.waitSubscribed()
	g.publish(0, false)
	checkGoUpdate(t, rs.next(t), 0, 0, ResetNone)
	send := func(frames ...[]byte) {
		if err := g.pubs[0].Send(zmq4.NewMsgFrom(frames...)); err != nil {
			t.Fatal(err)
		}
	}
	send(nil, seq8(1)) // two frames
	send(nil, []byte{0, 1}, testPayload(t, 0, 1))
	send(nil, seq8(1), []byte{0x93, 0xc1}) // seq 1, payload not msgpack
	g.seq[0] = 2
	g.publish(0, false)
	checkGoUpdate(t, rs.next(t), 0, 2, ResetGapLost)
	g.publish(0, false)
	checkGoUpdate(t, rs.next(t), 0, 3, ResetNone)
	rs.none(t)
	if st := rs.s.Stats(); st.Malformed != 3 || st.Gaps != 0 || st.UnrecoverableGaps != 0 || st.Batches != 3 {
		t.Fatalf("stats %+v", st)
	}
}
