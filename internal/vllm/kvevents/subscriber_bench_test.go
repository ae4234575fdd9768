package kvevents

import (
	"context"
	"encoding/binary"
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
		c, err := openZMTP(context.Background(), nc, zmq4.Pub, true)
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
