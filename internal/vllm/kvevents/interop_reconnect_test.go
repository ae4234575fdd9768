package kvevents

import (
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"kvrouter/internal/testwait"
)

// tcpProxy forwards loopback TCP connections to target. cut closes every
// connection made so far (a network blip between router and engine); new
// connections are still accepted and forwarded.
type tcpProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newTCPProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() { ln.Close(); p.cut(); p.wg.Wait() })
	return p
}

func (p *tcpProxy) endpoint() string { return "tcp://" + p.ln.Addr().String() }

func (p *tcpProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		p.wg.Add(2)
		pipe := func(dst, src net.Conn) {
			defer p.wg.Done()
			io.Copy(dst, src)
			dst.Close()
			src.Close()
		}
		go pipe(u, c)
		go pipe(c, u)
	}
}

// cut closes every connection made so far.
func (p *tcpProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// caughtUp starts publisher.py as an engine that has published batches
// 0..history-1 of epoch 0 and gone idle, then a subscriber (to pubEP(p) if
// given, else p's PUB), and checks that the subscriber catches up on all of
// them by replay on connecting, without any new batch.
func caughtUp(t *testing.T, history uint64, cfg SubscriberConfig, pubEP func(*pyPub) string) (*pyPub, *runningSub) {
	t.Helper()
	p := startPyPub(t, "--history", strconv.FormatUint(history, 10))
	cfg.Endpoint, cfg.ReplayEndpoint, cfg.Topic = p.pub, p.replay, "kv-events"
	if pubEP != nil {
		cfg.Endpoint = pubEP(p)
	}
	rs := startSub(t, cfg)
	n := history
	for seq := range n {
		u := rs.next(t)
		checkPyUpdate(t, u, 0, seq, ResetNone)
		if !u.Replayed {
			t.Fatalf("seq %d of an idle engine not replayed", seq)
		}
	}
	rs.none(t)
	if st := rs.s.Stats(); st.Replays != 1 || st.Gaps != 0 || st.UnrecoverableGaps != 0 || st.Restarts != 0 || st.Batches != n {
		t.Fatalf("after catch-up: %+v", st)
	}
	return p, rs
}

// TestInteropRouterStartsLate: a router started after the engine published
// batches and went idle catches up at once (replay from 0 on connecting),
// without waiting for a new batch; the next live batch follows with no
// duplicate.
func TestInteropRouterStartsLate(t *testing.T) {
	p, rs := caughtUp(t, 5, SubscriberConfig{Engine: "late"}, nil)
	for attempt := 0; ; attempt++ {
		if attempt == 25 {
			t.Fatal("no live batch after the catch-up")
		}
		next := p.do("publish 1")
		if u, ok := rs.tryNext(300 * time.Millisecond); ok {
			// Batches lost before the subscription reached the publisher
			// are a gap, replayed when a later one arrives.
			checkPyUpdate(t, u, 0, 5, ResetNone)
			for seq := uint64(6); seq < next; seq++ {
				checkPyUpdate(t, rs.next(t), 0, seq, ResetNone)
			}
			break
		}
	}
	rs.none(t)
	if st := rs.s.Stats(); st.Restarts != 0 || st.UnrecoverableGaps != 0 || st.Reconnects != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestInteropEngineReplaced: the engine process that published seqs 0..4
// (applied) is replaced by a new process on the same ports. However much
// the new process has published, the consumer is told to drop the rank's
// state on reconnection, without any new live batch, and then gets exactly
// the new process's buffered batches.
func TestInteropEngineReplaced(t *testing.T) {
	tests := []struct {
		name    string
		args    []string // of the new process
		reset   ResetReason
		seqs    []uint64 // its batches the consumer gets (epoch 1), the first with reset
		restart uint64   // kvrouter_vllm_restarts_total
		lost    uint64   // unrecoverable_gaps
	}{
		// Empty buffer: the new process never published seq 4.
		{"idle", nil, ResetRestart, nil, 1, 0},
		// Seqs 0..2: still nothing at or after 4.
		{"fewer batches", []string{"--history", "3"}, ResetRestart, []uint64{0, 1, 2}, 1, 0},
		// Seqs 0..7: seq 4 is buffered but is not the batch applied as 4
		// (frames.md §4's case that the seq alone cannot reveal).
		{"more batches", []string{"--history", "8"}, ResetRestart, []uint64{0, 1, 2, 3, 4, 5, 6, 7}, 1, 0},
		// Seqs 0..9 with a 4-batch buffer: seq 4 is no longer buffered;
		// indistinguishable from the same process having missed too much.
		{"buffer rolled past", []string{"--history", "10", "--buffer", "4"}, ResetGapLost, []uint64{6, 7, 8, 9}, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, rs := caughtUp(t, 5, SubscriberConfig{
				Engine: "replaced", ReconnectMin: 20 * time.Millisecond, ReconnectMax: 200 * time.Millisecond,
			}, nil)
			p.stop()
			p2 := startPyPub(t, append([]string{"--pub", p.pub, "--replay", p.replay, "--epoch", "1"}, tt.args...)...)
			if len(tt.seqs) == 0 {
				checkResetOnly(t, rs.next(t), 0, tt.reset)
			}
			for i, seq := range tt.seqs {
				reset := ResetNone
				if i == 0 {
					reset = tt.reset
				}
				u := rs.next(t)
				checkPyUpdate(t, u, 1, seq, reset)
				if !u.Replayed {
					t.Fatalf("seq %d of the new process not replayed", seq)
				}
			}
			rs.none(t)
			st := rs.s.Stats()
			if st.Reconnects != 1 || st.Restarts != tt.restart || st.UnrecoverableGaps != tt.lost || st.Gaps != 0 || st.ReplayErrors != 0 {
				t.Fatalf("stats %+v", st)
			}
			if got := counterValue(t, rs.s.m.restarts, "replaced", "0"); got != float64(tt.restart) {
				t.Fatalf("kvrouter_vllm_restarts_total = %v, want %d", got, tt.restart)
			}
			// The new process's live batches follow with no reset.
			next := uint64(0)
			if n := len(tt.seqs); n > 0 {
				next = tt.seqs[n-1] + 1
			}
			if next == 0 {
				firstLive(t, p2, rs, 1, 0)
			} else {
				got := p2.do("publish 1")
				checkPyUpdate(t, rs.next(t), 1, got-1, ResetNone)
			}
			rs.none(t)
		})
	}
}

// TestInteropNetworkBlip: the connection between router and engine breaks
// and comes back while the engine process stays the same (a proxy in
// between cuts it). Batches published meanwhile are replayed on
// reconnection; nothing is reset and no batch reaches the consumer twice.
// A blip during which nothing was published delivers nothing.
func TestInteropNetworkBlip(t *testing.T) {
	var proxy *tcpProxy
	p, rs := caughtUp(t, 3, SubscriberConfig{
		Engine: "blip", ReconnectMin: 500 * time.Millisecond, ReconnectMax: time.Second,
	}, func(p *pyPub) string {
		proxy = newTCPProxy(t, strings.TrimPrefix(p.pub, "tcp://"))
		return proxy.endpoint()
	})
	next := firstLive(t, p, rs, 0, 3)
	if !rs.s.Connected() {
		t.Fatal("Connected() false while the live connection is up")
	}

	// Cut; publish 2 while the subscriber is backing off (500ms).
	proxy.cut()
	testwait.For(t, "disconnect", func() bool { return testutil.ToFloat64(rs.s.m.connected.WithLabelValues("blip", "0")) == 0 })
	if rs.s.Connected() {
		t.Fatal("Connected() true with the connection cut")
	}
	from := next
	next = p.do("publish 2")
	for seq := from; seq < next; seq++ {
		u := rs.next(t)
		checkPyUpdate(t, u, 0, seq, ResetNone)
		if !u.Replayed {
			t.Fatalf("seq %d published during the blip not replayed", seq)
		}
	}
	rs.none(t)
	if st := rs.s.Stats(); st.Reconnects != 1 {
		t.Fatalf("after blip: %+v", st)
	}

	// A blip with nothing published: the replay returns only the batch
	// already applied, so nothing is delivered.
	proxy.cut()
	testwait.For(t, "second reconnect", func() bool { return rs.s.Stats().Reconnects == 2 })
	rs.none(t)

	next = firstLive(t, p, rs, 0, next)
	rs.none(t)
	st := rs.s.Stats()
	if st.Restarts != 0 || st.UnrecoverableGaps != 0 || st.ReplayErrors != 0 || st.Reconnects != 2 {
		t.Fatalf("final stats %+v", st)
	}
	if st.Batches != next {
		t.Fatalf("%d batches decoded for seqs 0..%d: some twice", st.Batches, next-1)
	}
}
