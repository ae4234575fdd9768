package kvevents

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// reconnectUnchecked runs a subscriber through a proxy to a zmq4 PUB:
// seqs 0 and 1 applied, then the connection is cut. The reconnection
// cannot be checked, so the consumer gets a ResetReconnect without a
// batch at once; batches after it apply on an empty state with no further
// reset.
func reconnectUnchecked(t *testing.T, cfg SubscriberConfig, wantReplays, wantReplayErrors uint64) {
	t.Helper()
	base := freePorts(t, 1)
	g := newGoPub(t, "", base, 1, false)
	proxy := newTCPProxy(t, fmt.Sprintf("127.0.0.1:%d", base))
	cfg.Endpoint, cfg.ReconnectMin, cfg.ReconnectMax = proxy.endpoint(), 20*time.Millisecond, 100*time.Millisecond
	rs := startSub(t, cfg)
	g.waitSubscribed()
	g.publish(0, false)
	g.publish(0, false)
	checkGoUpdate(t, rs.next(t), 0, 0, ResetNone)
	checkGoUpdate(t, rs.next(t), 0, 1, ResetNone)

	proxy.cut()
	checkResetOnly(t, rs.next(t), 0, ResetReconnect)
	// The new connection's subscription may reach the PUB after a publish:
	// publish until one arrives. Whatever seq comes first starts the new
	// state: no hole, no reset. It may arrive after a later publish (a
	// replay check that times out holds the first batch back): every batch
	// published after it then follows in order.
	var published []uint64
	for attempt := 0; ; attempt++ {
		if attempt == 50 {
			t.Fatalf("nothing received after the reconnect; published seqs %v", published)
		}
		published = append(published, g.publish(0, false))
		if u, ok := rs.tryNext(200 * time.Millisecond); ok {
			i := slices.Index(published, u.Seq)
			if i < 0 {
				t.Fatalf("first update after the reconnect has seq %d, not one published since (%v)", u.Seq, published)
			}
			checkGoUpdate(t, u, 0, u.Seq, ResetNone)
			for _, seq := range published[i+1:] {
				checkGoUpdate(t, rs.next(t), 0, seq, ResetNone)
			}
			break
		}
	}
	seq := g.publish(0, false)
	checkGoUpdate(t, rs.next(t), 0, seq, ResetNone)
	rs.none(t)
	st := rs.s.Stats()
	if st.Reconnects != 1 || st.UnrecoverableGaps != 1 || st.Restarts != 0 || st.Replays != wantReplays || st.ReplayErrors != wantReplayErrors {
		t.Fatalf("stats %+v", st)
	}
	if v := counterValue(t, rs.s.m.unrecoverable, cfg.Engine, "0"); v != 1 {
		t.Fatalf("kvrouter_vllm_unrecoverable_gaps_total = %v, want 1", v)
	}
}

// TestReconnectWithoutReplay: with no replay endpoint a reconnection is
// always a conservative ResetReconnect (the engine may have restarted).
func TestReconnectWithoutReplay(t *testing.T) {
	reconnectUnchecked(t, SubscriberConfig{Engine: "e-noreplay"}, 0, 0)
}

// TestReconnectReplayFails: a replay endpoint that answers the catch-up on
// connecting (nothing buffered) but not the check on reconnecting: the
// check times out and the reconnection is reset as unchecked. (Replays:
// the catch-up, the check, and the catch-up when the first batch after the
// reset is not seq 0.)
func TestReconnectReplayFails(t *testing.T) {
	port := freePorts(t, 1)
	r := newGoRouter(t, port, func(req [][]byte) [][][]byte {
		if binary.BigEndian.Uint64(req[1]) == 0 {
			return [][][]byte{{nil, nil, seq8(endSeq), nil}}
		}
		return nil // silent
	})
	reconnectUnchecked(t, SubscriberConfig{Engine: "e-failing", ReplayEndpoint: r.ep, ReplayTimeout: 200 * time.Millisecond}, 3, 1)
}

// TestFlushResetQueueFull: a reset without a batch that does not fit the
// consumer queue is neither dropped nor counted: it rides on the rank's
// next Update.
func TestFlushResetQueueFull(t *testing.T) {
	s, err := NewSubscriber(SubscriberConfig{Engine: "e-full", Endpoint: "tcp://127.0.0.1:1", QueueSize: 1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := s.newRank(0)
	s.queue <- Update{Seq: 99}
	r.setPending(ResetRestart)
	r.flushReset()
	if len(s.queue) != 1 || r.pending != ResetRestart {
		t.Fatalf("queue %d, pending %v after flush on a full queue", len(s.queue), r.pending)
	}
	<-s.queue
	r.handle(0, testPayload(t, 0, 0), false)
	checkGoUpdate(t, <-s.queue, 0, 0, ResetRestart)
	r.flushReset() // nothing pending: nothing sent
	if len(s.queue) != 0 {
		t.Fatalf("flush with nothing pending queued %+v", <-s.queue)
	}
	if st := s.Stats(); st.QueueDrops != 0 || st.Batches != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestResetReasonString covers every reason's name (docs and logs use them).
func TestResetReasonString(t *testing.T) {
	var got []string
	for r := ResetNone; r <= ResetReconnect+1; r++ {
		got = append(got, r.String())
	}
	if s := strings.Join(got, ","); s != "none,restart,gap_lost,overflow,reconnect,ResetReason(5)" {
		t.Fatalf("names %s", s)
	}
}
