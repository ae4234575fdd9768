package enginesim

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"kvrouter/internal/vllm"

	"kvrouter/internal/testwait"
)

// TestReplayBufferBounds drives the ring with random payload sizes against
// a plain slice trimmed from the front until both bounds hold, checking
// after every push that both bounds hold exactly (not at 2x), that the
// newest batches are the ones kept (the newest always, even when larger
// than the byte bound alone), and that replay from any seq returns the
// same batches as the model.
func TestReplayBufferBounds(t *testing.T) {
	for _, tc := range []struct {
		name     string
		maxItems int
		maxBytes int64
		maxSize  int
	}{
		{"count-bound", 50, 1 << 30, 100},
		{"byte-bound", 10000, 64 << 10, 8 << 10},
		{"both", 40, 16 << 10, 1 << 10},
		{"huge-batches", 100, 4 << 10, 16 << 10}, // many batches exceed the bound alone
		{"one", 1, 1 << 20, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(tc.maxItems)))
			b := replayBuffer{maxItems: tc.maxItems, maxBytes: tc.maxBytes}
			var model []replayItem
			var modelBytes int64
			trimmed := 0
			for seq := range uint64(3000) {
				if seq == 1500 { // a restart empties it, as Run does
					b.reset()
					model, modelBytes = nil, 0
				}
				p := make([]byte, rng.IntN(tc.maxSize)+1)
				p[0] = byte(seq)
				b.push(seq, p)
				model = append(model, replayItem{seq, p})
				modelBytes += int64(len(p)) + replayItemSize
				for len(model) > tc.maxItems || (len(model) > 1 && modelBytes > tc.maxBytes) {
					modelBytes -= int64(len(model[0].payload)) + replayItemSize
					model = model[1:]
					trimmed++
				}
				overBytes := b.bytes > tc.maxBytes && b.n != 1 // the newest batch alone may exceed it
				if b.n > tc.maxItems || overBytes || b.n != len(model) || b.bytes != modelBytes || b.from(nil, seq)[0].seq != seq {
					t.Fatalf("seq %d: %d items, %d bytes; want %d items, %d bytes (bounds %d, %d)",
						seq, b.n, b.bytes, len(model), modelBytes, tc.maxItems, tc.maxBytes)
				}
				if len(b.ring) > tc.maxItems {
					t.Fatalf("ring grew to %d slots, bound %d", len(b.ring), tc.maxItems)
				}
				if seq%97 == 0 {
					for _, start := range []uint64{0, seq / 2, seq, seq + 1} {
						got := b.from(nil, start)
						want := slices.DeleteFunc(slices.Clone(model), func(it replayItem) bool { return it.seq < start })
						if !slices.EqualFunc(got, want, func(a, b replayItem) bool {
							return a.seq == b.seq && &a.payload[0] == &b.payload[0]
						}) {
							t.Fatalf("seq %d: from(%d) gives %d items, want %d", seq, start, len(got), len(want))
						}
					}
				}
			}
			if trimmed == 0 {
				t.Fatal("the bounds were never reached")
			}
		})
	}
}

// TestPublisherQueueBytes: batches published while the publisher does not
// run (a stall, a starved goroutine) queue up to QueueBytes, the rest are
// dropped and counted as queue_full before getting a seq; once the
// publisher runs, every queued batch gets a seq and the queued estimate
// returns to zero.
func TestPublisherQueueBytes(t *testing.T) {
	const bound = 1 << 20
	cfg, err := KVEventsConfig{EnableKVCacheEvents: true, Endpoint: "tcp://127.0.0.1:0", Bind: true, QueueBytes: bound}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	m, err := newMetrics(prometheus.NewRegistry(), "m", CoreConfig{}, "fast", &atomic.Pointer[snapshot]{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	p, err := newPublisher(cfg, 0, false, 0, wallClock{}, slog.New(slog.DiscardHandler), m)
	if err != nil {
		t.Fatal(err)
	}
	// One 8,192-token chunk of a long prompt: 512 blocks.
	toks := make([]uint32, 8192)
	hashes := make([]vllm.BlockHash, 512)
	b := vllm.Batch{Events: []vllm.Event{{Type: vllm.BlockStored, BlockHashes: hashes, TokenIDs: toks, BlockSize: 16,
		ExtraKeys: make([][]any, 512), KVCacheSpecKind: vllm.FullAttention}}}
	size := batchMemSize(&b)
	if size < 4*8192+8*512 {
		t.Fatalf("batchMemSize %d is below the token ids and hashes it references", size)
	}
	const n = 100
	for range n {
		p.publish(b)
	}
	fit := int(bound / size)
	dropped := testutil.ToFloat64(m.eventsDropped.WithLabelValues("queue_full"))
	if len(p.in) != fit || int(dropped) != n-fit || p.queued.Load() != int64(fit)*size {
		t.Fatalf("queued %d batches (%d bytes), dropped %v; want %d queued (%d bytes of %d each within %d), %d dropped",
			len(p.in), p.queued.Load(), dropped, fit, int64(fit)*size, size, bound, n-fit)
	}

	ctx, cancel := context.WithCancel(context.Background())
	pub := zmq4.NewPub(ctx)
	done := make(chan error, 1)
	go func() { _, err := p.loop(ctx, pub); done <- err }()
	testwait.For(t, "queued batches published", func() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.next == uint64(fit) })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	pub.Close()
	if q := p.queued.Load(); q != 0 {
		t.Fatalf("queued estimate %d after the queue drained, want 0", q)
	}
	p.publish(b) // room again
	if len(p.in) != 1 {
		t.Fatalf("a batch after draining was not queued")
	}
}
