package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"kvrouter/internal/vllm"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"kvrouter/internal/testwait"
)

// bufEngine is an in-process engine rank on real ZeroMQ over loopback: a
// zmq4 PUB for live batches and a zmq4 ROUTER answering replay requests
// from a buffer of its last bufferSteps batches, as vLLM's
// ZmqEventPublisher does (kv_events.py: a request for a seq older than the
// buffer starts at the oldest batch held; replies ["", topic, seq8,
// payload], then the end marker). It keeps the engine's own view of its
// cache, the set of block hashes held, to compare with what a consumer
// rebuilt from the events.
type bufEngine struct {
	t           testing.TB
	topic       string
	bufferSteps int
	pub         zmq4.Socket
	router      zmq4.Socket
	pubEP       string
	replayEP    string
	wg          sync.WaitGroup

	mu       sync.Mutex
	buf      [][]byte // payloads of seqs next-len(buf) .. next-1
	next     uint64   // seq of the next batch
	held     map[vllm.BlockHash]bool
	requests int
}

func newBufEngine(t testing.TB, topic string, bufferSteps int) *bufEngine {
	t.Helper()
	base := freePorts(t, 2)
	e := &bufEngine{
		t: t, topic: topic, bufferSteps: bufferSteps, held: map[vllm.BlockHash]bool{},
		pub: zmq4.NewPub(context.Background()), router: zmq4.NewRouter(context.Background()),
		pubEP: fmt.Sprintf("tcp://127.0.0.1:%d", base), replayEP: fmt.Sprintf("tcp://127.0.0.1:%d", base+1),
	}
	if err := e.pub.Listen(e.pubEP); err != nil {
		t.Fatal(err)
	}
	if err := e.router.Listen(e.replayEP); err != nil {
		t.Fatal(err)
	}
	e.wg.Add(1)
	go e.serveReplay()
	t.Cleanup(func() { e.pub.Close(); e.router.Close(); e.wg.Wait() })
	return e
}

// serveReplay answers each request with the buffered batches from the
// requested seq on (from the oldest when it is older), then the end marker.
// A reply that cannot be sent (the subscriber closed its DEALER early, as it
// does when the consumer queue fills during a catch-up) ends that answer
// only.
func (e *bufEngine) serveReplay() {
	defer e.wg.Done()
	for {
		msg, err := e.router.Recv()
		if err != nil {
			return
		}
		if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
			continue
		}
		id, from := msg.Frames[0], binary.BigEndian.Uint64(msg.Frames[2])
		e.mu.Lock()
		e.requests++
		oldest := e.next - uint64(len(e.buf))
		var replies [][][]byte
		for s := max(from, oldest); s < e.next; s++ {
			replies = append(replies, [][]byte{id, nil, []byte(e.topic), seq8(s), e.buf[s-oldest]})
		}
		e.mu.Unlock()
		replies = append(replies, [][]byte{id, nil, nil, seq8(endSeq), nil})
		for _, r := range replies {
			if err := e.router.Send(zmq4.NewMsgFrom(r...)); err != nil {
				break
			}
		}
	}
}

// engineBatch is batch seq of the engine: a BlockStored of two blocks
// chained on the previous batch's (a new chain every 8 batches), the
// removal of the blocks stored 16 batches before, and an AllBlocksCleared
// every 1000 batches; its hashes are unique per seq.
func engineBatch(seq uint64) vllm.Batch {
	h := func(s uint64, i int) vllm.BlockHash { return vllm.BlockHash(s<<1 | uint64(i) | 1<<40) }
	var evs []vllm.Event
	if seq > 0 && seq%1000 == 0 {
		evs = append(evs, vllm.Event{Type: vllm.AllBlocksCleared})
	}
	st := vllm.Event{Type: vllm.BlockStored, BlockHashes: []vllm.BlockHash{h(seq, 0), h(seq, 1)},
		TokenIDs: []uint32{1, 2, 3, 4, 5, 6, 7, uint32(seq)}, BlockSize: 4, Medium: "GPU"}
	if seq%8 != 0 {
		p := h(seq-1, 1)
		st.ParentBlockHash = &p
	}
	evs = append(evs, st)
	if seq >= 16 && (seq-16)/1000 == seq/1000 { // not stored before a clear
		evs = append(evs, vllm.Event{Type: vllm.BlockRemoved, BlockHashes: []vllm.BlockHash{h(seq-16, 0), h(seq-16, 1)}, Medium: "GPU"})
	}
	return vllm.Batch{TS: 1754530955 + float64(seq)/100, Events: evs}
}

// applyHeld applies b's events to a set of held block hashes.
func applyHeld(held map[vllm.BlockHash]bool, b *vllm.Batch) {
	for _, ev := range b.Events {
		switch ev.Type {
		case vllm.BlockStored:
			for _, h := range ev.BlockHashes {
				held[h] = true
			}
		case vllm.BlockRemoved:
			for _, h := range ev.BlockHashes {
				delete(held, h)
			}
		case vllm.AllBlocksCleared:
			clear(held)
		}
	}
}

// publish sends the engine's next batch live and buffers it (after the
// send, as vLLM does) and returns its seq.
func (e *bufEngine) publish() uint64 {
	e.t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	seq := e.next
	b := engineBatch(seq)
	payload, err := vllm.AppendBatch(nil, &b, vllm.LayoutMap)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.pub.Send(zmq4.NewMsgFrom([]byte(e.topic), seq8(seq), payload)); err != nil {
		e.t.Fatalf("publish seq %d: %v", seq, err)
	}
	e.buf = append(e.buf, payload)
	if len(e.buf) > e.bufferSteps {
		e.buf = e.buf[1:]
	}
	e.next++
	applyHeld(e.held, &b)
	return seq
}

// published is the number of batches the engine has published.
func (e *bufEngine) published() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.next
}

// waitSubscribed waits for the subscriber's SUB on the engine's PUB.
func (e *bufEngine) waitSubscribed() {
	e.t.Helper()
	testwait.For(e.t, "subscription", func() bool { return len(e.pub.(zmq4.Topics).Topics()) > 0 })
}

// heldConsumer rebuilds the engine's held blocks from Updates, as the index
// does: a reset drops everything, then the batch is applied. It records
// every Update's seq and reset.
type heldConsumer struct {
	mu     sync.Mutex
	held   map[vllm.BlockHash]bool
	seqs   []uint64
	resets []Update
	last   uint64
}

func newHeldConsumer() *heldConsumer { return &heldConsumer{held: map[vllm.BlockHash]bool{}} }

func (c *heldConsumer) apply(u Update) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if u.Reset != ResetNone {
		clear(c.held)
		c.resets = append(c.resets, Update{Seq: u.Seq, Reset: u.Reset, Replayed: u.Replayed})
	}
	applyHeld(c.held, &u.Batch)
	c.seqs = append(c.seqs, u.Seq)
	c.last = u.Seq
}

// lastSeq is the seq of the last Update applied (0 before any).
func (c *heldConsumer) lastSeq() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

func (c *heldConsumer) got(seq uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seqs) > 0 && c.last == seq
}

// runSubscriber runs s with apply until the returned stop is called (or
// the test ends) and fails the test if Run returns an error.
func runSubscriber(t *testing.T, s *Subscriber, apply func(Update)) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- s.Run(ctx, apply) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-runErr; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// waitDrops blocks (a consumer held up) until s has counted n queue drops,
// or for at most a minute.
func waitDrops(s *Subscriber, n uint64) {
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline) && s.Stats().QueueDrops < n; {
		time.Sleep(time.Millisecond)
	}
}

// TestOverflowCaughtUpByReplay: the engine publishes faster than the
// consumer applies: at seqs 0, 1000, ..., 5000 the consumer stops until the
// 64-batch queue has overflowed by two queue sizes (the engine runs up to 8
// queue sizes ahead of it). Every overflow is caught up through the replay
// endpoint from the last queued seq: the consumer gets each of the 6000
// batches once, in order, with no reset, and rebuilds exactly the engine's
// set of held blocks; every batch counted in queue_drops is recovered.
func TestOverflowCaughtUpByReplay(t *testing.T) {
	const n, queue = 6000, 64
	e := newBufEngine(t, "kv@e0@m", 10000)
	c := newHeldConsumer()
	s, err := NewSubscriber(SubscriberConfig{
		Engine: "e-fast", Endpoint: e.pubEP, ReplayEndpoint: e.replayEP, Topic: "kv@", QueueSize: queue,
	}, testLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	stop := runSubscriber(t, s, func(u Update) {
		if u.Seq%1000 == 0 {
			waitDrops(s, s.Stats().QueueDrops+2*queue)
		}
		c.apply(u)
	})
	e.waitSubscribed()
	for seq := uint64(0); seq < n; seq = e.publish() + 1 {
		for c.lastSeq()+8*queue < seq {
			time.Sleep(100 * time.Microsecond) // keep at most 8 queue sizes ahead
		}
	}
	testwait.Within(t, time.Minute, "the last batch", func() bool { return c.got(n - 1) })
	recovered := counterValue(t, s.m.recovered, "e-fast", "0") // series go when Run returns
	stop()

	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.resets) != 0 {
		t.Fatalf("resets %+v, want none while the replay buffer covers every overflow", c.resets)
	}
	if len(c.seqs) != n {
		t.Fatalf("%d updates, want %d", len(c.seqs), n)
	}
	for i, s := range c.seqs {
		if s != uint64(i) {
			t.Fatalf("update %d has seq %d: not each batch once, in order", i, s)
		}
	}
	if len(c.held) != len(e.held) {
		t.Fatalf("consumer holds %d blocks, engine %d", len(c.held), len(e.held))
	}
	for h := range e.held {
		if !c.held[h] {
			t.Fatalf("engine block %d missing from the consumer's state", h)
		}
	}
	st := s.Stats()
	t.Logf("stats %+v, replay requests %d", st, e.requests)
	if st.QueueDrops < 6*2*queue || st.QueueRecovered != st.QueueDrops || st.OverflowResets != 0 ||
		st.UnrecoverableGaps != 0 || st.Batches != n || st.Replays < 7 {
		t.Fatalf("stats %+v: want >= %d drops, all recovered, no reset, %d batches, a catch-up replay per overflow",
			st, 6*2*queue, n)
	}
	if recovered != float64(st.QueueRecovered) {
		t.Fatalf("queue_recovered_total %v, stats %d", recovered, st.QueueRecovered)
	}
}

// TestOverflowBeyondReplayBuffer: the consumer stops on the first batch
// until all 640 batches of the engine have found the 16-batch queue full;
// the engine buffers its last 16 batches only, so the ones after the last
// queued are gone: the catch-up resets the rank once (ResetOverflow, on the
// oldest batch still buffered, replayed), logs what was lost, and goes on
// from the buffer as the new state, which is the engine's.
func TestOverflowBeyondReplayBuffer(t *testing.T) {
	const queue, buffer, n = 16, 16, 40 * 16
	e := newBufEngine(t, "", buffer)
	c := newHeldConsumer()
	rec := &recordHandler{}
	s, err := NewSubscriber(SubscriberConfig{
		Engine: "e-far", Endpoint: e.pubEP, ReplayEndpoint: e.replayEP, QueueSize: queue,
	}, slog.New(rec), nil)
	if err != nil {
		t.Fatal(err)
	}
	// Seqs 0..queue (the one in apply and the queue) are queued; the
	// catch-up asks from queue+1 and gets the buffer, n-buffer..n-1.
	from, first := uint64(queue+1), uint64(n-buffer)
	stop := runSubscriber(t, s, func(u Update) {
		if u.Seq == 0 && u.Reset == ResetNone {
			waitDrops(s, n-from)
		}
		c.apply(u)
	})
	e.waitSubscribed()
	for range n {
		e.publish()
	}
	testwait.Within(t, time.Minute, "the last batch", func() bool { return c.got(n - 1) })
	stop()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.resets) != 1 || c.resets[0].Seq != first || c.resets[0].Reset != ResetOverflow || !c.resets[0].Replayed {
		t.Fatalf("resets %+v, want one overflow reset on replayed seq %d", c.resets, first)
	}
	if len(c.held) != len(e.held) {
		t.Fatalf("consumer holds %d blocks, engine %d", len(c.held), len(e.held))
	}
	st := s.Stats()
	if st.OverflowResets != 1 || st.UnrecoverableGaps != 1 || st.QueueDrops != n-from ||
		st.QueueRecovered != buffer || st.Batches != from+buffer {
		t.Fatalf("stats %+v: want 1 overflow reset, %d drops, %d recovered", st, n-from, buffer)
	}
	r, ok := rec.find("consumer queue overflow not recoverable")
	if !ok || r.Level != slog.LevelWarn || r.attr("requested_seq") != fmt.Sprint(from) ||
		r.attr("first_seq") != fmt.Sprint(first) || r.attr("lost_batches") != fmt.Sprint(first-from) {
		t.Fatalf("log %+v (found %v), want a warning with requested_seq %d first_seq %d lost_batches %d", r, ok, from, first, first-from)
	}
}

// recordHandler keeps every log record, for tests that check a line's
// level and attributes.
type recordHandler struct {
	mu   sync.Mutex
	recs []loggedRecord
}

type loggedRecord struct {
	Level slog.Level
	Msg   string
	Attrs map[string]string
}

func (r loggedRecord) attr(k string) string { return r.Attrs[k] }

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	lr := loggedRecord{Level: r.Level, Msg: r.Message, Attrs: map[string]string{}}
	r.Attrs(func(a slog.Attr) bool { lr.Attrs[a.Key] = a.Value.String(); return true })
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, lr)
	return nil
}

// WithAttrs shares the record list with the parent; groups are not used.
func (h *recordHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &recordView{h: h, attrs: as}
}

func (h *recordHandler) WithGroup(string) slog.Handler { return h }

// find returns the first record whose message starts with prefix.
func (h *recordHandler) find(prefix string) (loggedRecord, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.recs {
		if len(r.Msg) >= len(prefix) && r.Msg[:len(prefix)] == prefix {
			return r, true
		}
	}
	return loggedRecord{}, false
}

// recordView is a recordHandler with attributes added by With.
type recordView struct {
	h     *recordHandler
	attrs []slog.Attr
}

func (v *recordView) Enabled(context.Context, slog.Level) bool { return true }

func (v *recordView) Handle(ctx context.Context, r slog.Record) error {
	r2 := r.Clone()
	r2.AddAttrs(v.attrs...)
	return v.h.Handle(ctx, r2)
}

func (v *recordView) WithAttrs(as []slog.Attr) slog.Handler {
	return &recordView{h: v.h, attrs: append(append([]slog.Attr{}, v.attrs...), as...)}
}

func (v *recordView) WithGroup(string) slog.Handler { return v }
