package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"kvrouter/internal/vllm"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// BenchmarkSubscriberLoopback measures the subscriber end to end over
// loopback TCP: a ZMTP PUB connection writes live batches (one BlockStored
// of 32 blocks of 16 tokens each, map layout, 1.3 KB) and the consumer
// counts the Updates. One op is a burst of 1000 batches written back to back
// and waited for until the consumer has all of them. Reported: batches/s and
// blocks/s received, allocations per batch (publisher included; it
// allocates ~nothing).
//
//	go test -run '^$' -bench BenchmarkSubscriberLoopback -benchtime 1s -count 1 ./internal/vllm/
func BenchmarkSubscriberLoopback(b *testing.B) {
	const blocks, blockSize = 32, 16
	ev := vllm.Event{Type: vllm.BlockStored, BlockSize: blockSize, Medium: "GPU", GroupIdx: new(int)}
	for i := range blocks {
		ev.BlockHashes = append(ev.BlockHashes, vllm.BlockHash(uint64(i)*0x9e3779b97f4a7c15))
		for j := range blockSize {
			ev.TokenIDs = append(ev.TokenIDs, uint32(1000+i*blockSize+j))
		}
	}
	payload, err := vllm.AppendBatch(nil, &vllm.Batch{TS: 1754530955, Events: []vllm.Event{ev}}, vllm.LayoutMap)
	if err != nil {
		b.Fatal(err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan *zmtpConn, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		c, err := openZMTP(context.Background(), nc, zmq4.Pub, true, frameLimit{})
		if err != nil {
			close(accepted)
			return
		}
		if _, err := c.recv(); err != nil { // the subscription
			close(accepted)
			return
		}
		accepted <- c
	}()

	const burst = 1000
	var got atomic.Int64
	done := make(chan struct{}, 1)
	s, err := NewSubscriber(SubscriberConfig{Endpoint: "tcp://" + ln.Addr().String(), QueueSize: 1 << 14}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() {
		runErr <- s.Run(ctx, func(u Update) {
			if got.Add(1)%burst == 0 {
				done <- struct{}{}
			}
		})
	}()
	pub, ok := <-accepted
	if !ok {
		b.Fatal("publisher connection failed")
	}
	defer pub.close()

	topic, seq := []byte("kv-events"), make([]byte, 8)
	b.ReportAllocs()
	var n uint64
	for b.Loop() {
		for range burst {
			binary.BigEndian.PutUint64(seq, n)
			n++
			if err := pub.send(topic, seq, payload); err != nil {
				b.Fatal(err)
			}
		}
		select {
		case <-done:
		case <-time.After(time.Minute):
			b.Fatalf("received %d of %d batches; stats %+v", got.Load(), n, s.Stats())
		}
	}
	elapsed := b.Elapsed().Seconds()
	b.StopTimer()
	cancel()
	if err := <-runErr; err != nil {
		b.Fatal(err)
	}
	if st := s.Stats(); st.QueueDrops != 0 || st.Gaps != 0 {
		b.Fatalf("lost batches: %+v", st)
	}
	b.ReportMetric(float64(n)/elapsed, "batches/s")
	b.ReportMetric(float64(n*blocks)/elapsed, "blocks/s")
}

// BenchmarkSubscriberOverflow measures catching up a full consumer queue by
// replay against an in-process engine on loopback ZeroMQ (zmq4 PUB, and a
// ROUTER replaying from a 10000-batch buffer; engineBatch payloads of
// about 150 bytes, encoded per batch by the publisher, whose allocations
// are included). One op is a burst of 1000 batches. queue=16384: the queue
// holds the burst (no overflow). queue=64: the consumer takes nothing until
// the whole burst has arrived (all but 65 found the queue full), then the
// dropped batches are caught up by replay. Reported: batches/s delivered,
// and catch-up replay requests per burst.
//
//	go test -run '^$' -bench BenchmarkSubscriberOverflow -benchtime 2s -count 1 ./internal/vllm/kvevents/
func BenchmarkSubscriberOverflow(b *testing.B) {
	for _, queue := range []int{16384, 64} {
		b.Run(fmt.Sprintf("queue=%d", queue), func(b *testing.B) {
			const burst = 1000
			e := newBufEngine(b, "", 10000)
			var got atomic.Int64
			done := make(chan struct{}, 1)
			var gate atomic.Int64 // drops the burst must reach before the consumer takes its first batch
			s, err := NewSubscriber(SubscriberConfig{Endpoint: e.pubEP, ReplayEndpoint: e.replayEP, QueueSize: queue, IdleCheck: -1}, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			runErr := make(chan error, 1)
			go func() {
				runErr <- s.Run(ctx, func(u Update) {
					n := got.Add(1)
					if n%burst == 1 && gate.Load() > 0 {
						waitDrops(s, uint64(gate.Load()))
					}
					if n%burst == 0 {
						done <- struct{}{}
					}
				})
			}()
			e.waitSubscribed()
			b.ReportAllocs()
			replays0 := s.Stats().Replays
			for b.Loop() {
				if queue < burst {
					gate.Store(int64(s.Stats().QueueDrops) + burst - int64(queue) - 1)
				}
				for range burst {
					e.publish()
				}
				select {
				case <-done:
				case <-time.After(time.Minute):
					b.Fatalf("received %d batches; stats %+v", got.Load(), s.Stats())
				}
			}
			elapsed := b.Elapsed().Seconds()
			b.StopTimer()
			st := s.Stats()
			cancel()
			if err := <-runErr; err != nil {
				b.Fatal(err)
			}
			if st.OverflowResets != 0 || st.QueueRecovered != st.QueueDrops || int(st.Batches) != int(e.published()) {
				b.Fatalf("stats %+v, published %d", st, e.published())
			}
			b.ReportMetric(float64(st.Batches)/elapsed, "batches/s")
			b.ReportMetric(float64(st.Replays-replays0)/float64(b.N), "replays/burst")
		})
	}
}
