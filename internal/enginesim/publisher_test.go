package enginesim

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"kvrouter/internal/vllm"
	"kvrouter/internal/vllm/kvevents"
)

// subscriber is a SUB socket bound on loopback (the engine connects, as
// vLLM does for an endpoint without "*"), its messages on a channel.
type subscriber struct {
	addr string
	msgs chan zmq4.Msg
}

func startSubscriber(t *testing.T) *subscriber {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sub := zmq4.NewSub(ctx)
	if err := sub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	s := &subscriber{addr: "tcp://" + sub.Addr().String(), msgs: make(chan zmq4.Msg, 1024)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			m, err := sub.Recv()
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				continue // a publisher went away (a restart); others may come
			}
			select {
			case s.msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		sub.Close()
		<-done
	})
	return s
}

// next returns the next message, failing after 5 s.
func (s *subscriber) next(t *testing.T) zmq4.Msg {
	t.Helper()
	select {
	case m := <-s.msgs:
		return m
	case <-time.After(5 * time.Second):
		t.Fatal("no KV event batch within 5 s")
		return zmq4.Msg{}
	}
}

// connect sends requests until the first batch arrives (the PUB connects
// asynchronously; earlier batches are lost, as with libzmq) and returns the
// seq of that batch.
func connect(t *testing.T, s *testServer, sub *subscriber) uint64 {
	t.Helper()
	for i := range 200 {
		post(t, s.url+"/v1/completions", map[string]any{"prompt": fmt.Sprintf("warm-up %03d %s", i, strings.Repeat("w", 32)), "max_tokens": 1})
		select {
		case m := <-sub.msgs:
			return binary.BigEndian.Uint64(m.Frames[1])
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatal("publisher never connected")
	return 0
}

func kvServer(t *testing.T, sub *subscriber, faults Faults) *testServer {
	t.Helper()
	return startServer(t, Config{
		KVEvents: KVEventsConfig{EnableKVCacheEvents: true, Endpoint: sub.addr,
			ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv", BufferSteps: 100},
		NewHasher:        func() (BlockHasher, error) { return vllm.NewBlockHasher(vllm.HashSHA256, "0", nil) },
		DataParallelRank: 0,
		Faults:           faults,
	})
}

// TestPublishAndReplay: a real ZeroMQ SUB receives vLLM's frames with the
// expected BlockStored (sha256 hashes with PYTHONHASHSEED=0), and a DEALER
// replays the buffer with 4-frame replies and the end marker.
func TestPublishAndReplay(t *testing.T) {
	sub := startSubscriber(t)
	s := kvServer(t, sub, Faults{})
	first := connect(t, s, sub)
	for len(sub.msgs) > 0 { // the rest of the warm-up
		<-sub.msgs
	}

	prompt := strings.Repeat("0123456789", 4) // 40 byte tokens: 2 full blocks
	post(t, s.url+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1})
	var m zmq4.Msg
	toks, _ := ByteTokenizer{}.Encode(prompt, true)
	h, _ := vllm.NewBlockHasher(vllm.HashSHA256, "0", nil)
	digests := h.HashPrompt(toks, 16, vllm.RequestKeys{})
	want := []vllm.BlockHash{vllm.EventValue(digests[0]), vllm.EventValue(digests[1])}
	var got vllm.Batch
	for { // skip late warm-up batches
		m = sub.next(t)
		b, err := vllm.DecodeBatch(m.Frames[2])
		if err != nil {
			t.Fatal(err)
		}
		if len(b.Events) > 0 && len(b.Events[0].TokenIDs) == 32 && b.Events[0].TokenIDs[0] == '0' {
			got = b
			break
		}
	}
	if len(m.Frames) != 3 || string(m.Frames[0]) != "kv" || len(m.Frames[1]) != 8 {
		t.Fatalf("frames %q", m.Frames)
	}
	e := got.Events[0]
	if e.Type != vllm.BlockStored || e.ParentBlockHash != nil || e.BlockSize != 16 || e.Medium != "GPU" ||
		len(e.BlockHashes) != 2 || e.BlockHashes[0] != want[0] || e.BlockHashes[1] != want[1] || len(e.ExtraKeys) != 2 {
		t.Fatalf("event %+v, want hashes %v", e, want)
	}

	// The same prompt with kv_cache_report_mode "full": a hit report for
	// both reused blocks (39 tokens rounded down), parent nil, nothing new.
	post(t, s.url+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1,
		"vllm_xargs": map[string]any{"kv_cache_report_mode": "full"}})
	m = sub.next(t)
	rep, err := vllm.DecodeBatch(m.Frames[2])
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Events) != 1 || rep.Events[0].ParentBlockHash != nil || len(rep.Events[0].BlockHashes) != 2 ||
		rep.Events[0].BlockHashes[1] != want[1] {
		t.Fatalf("hit report %+v", rep.Events)
	}
	lastSeq := binary.BigEndian.Uint64(m.Frames[1])

	// Replay everything from seq 0 over a DEALER.
	var seqs []uint64
	for _, f := range replayFrames(t, s) {
		if len(f) != 4 || len(f[0]) != 0 {
			t.Fatalf("replay reply %q", f)
		}
		seq := binary.BigEndian.Uint64(f[2])
		if seq == endSeq {
			if len(f[1]) != 0 || len(f[3]) != 0 {
				t.Fatalf("end marker %q", f)
			}
			break
		}
		if string(f[1]) != "kv" {
			t.Fatalf("replay topic %q", f[1])
		}
		if seq == lastSeq && !bytes.Equal(f[3], m.Frames[2]) {
			t.Fatal("replayed payload differs from the live one")
		}
		seqs = append(seqs, seq)
	}
	if len(seqs) == 0 || seqs[0] != 0 || seqs[len(seqs)-1] < lastSeq || first > lastSeq {
		t.Fatalf("replayed seqs %v, live first %d last %d", seqs, first, lastSeq)
	}
	for i, q := range seqs {
		if q != uint64(i) {
			t.Fatalf("replayed seqs not consecutive from 0: %v", seqs)
		}
	}
}

// TestDropEveryKAndRestart: every 2nd batch is dropped on the wire but kept
// for replay; a restart starts the sequence at 0 again with no
// AllBlocksCleared.
func TestDropEveryKAndRestart(t *testing.T) {
	sub := startSubscriber(t)
	s := kvServer(t, sub, Faults{DropEveryKBatches: 2})
	connect(t, s, sub)
	for i := range 6 {
		post(t, s.url+"/v1/completions", map[string]any{"prompt": fmt.Sprintf("drop %d %s", i, strings.Repeat("d", 32)), "max_tokens": 1})
	}
	// Drain until the publisher has been quiet for 500 ms: a batch of the
	// old process read after the restart would pass for the new one's
	// first (a fixed 50 ms wait let a loaded machine's late batch through).
	for quiet := time.NewTimer(500 * time.Millisecond); ; {
		select {
		case m := <-sub.msgs:
			if seq := binary.BigEndian.Uint64(m.Frames[1]); seq%2 == 1 {
				t.Fatalf("seq %d should have been dropped", seq)
			}
			quiet.Reset(500 * time.Millisecond)
			continue
		case <-quiet.C:
		}
		break
	}
	if r, b := post(t, s.url+"/admin/restart", nil); r.StatusCode != 200 {
		t.Fatalf("restart: %d %s", r.StatusCode, b)
	}
	// The restarted PUB dials the SUB again; batches before it connects are
	// lost, as with libzmq. The first one received has an even seq (odd
	// ones are dropped) and the replay buffer holds only the new process's
	// batches, from seq 0.
	first := connect(t, s, sub)
	if first%2 == 1 {
		t.Fatalf("after restart: seq %d should have been dropped", first)
	}
	seqs := replaySeqs(t, s)
	if len(seqs) == 0 || seqs[0] != 0 || seqs[len(seqs)-1] < first || len(seqs) > 250 {
		t.Fatalf("after restart: replayed seqs %v, first live %d", seqs, first)
	}
}

// replaySeqs asks the replay endpoint for everything from seq 0 and returns
// the replied seqs.
func replaySeqs(t *testing.T, s *testServer) []uint64 {
	t.Helper()
	var seqs []uint64
	for _, f := range replayFrames(t, s) {
		if seq := binary.BigEndian.Uint64(f[2]); seq != endSeq {
			seqs = append(seqs, seq)
		}
	}
	return seqs
}

// replayFrames asks the replay endpoint over a DEALER for everything from
// seq 0 and returns every reply's frames, the end marker's last.
func replayFrames(t *testing.T, s *testServer) [][][]byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, replayAddr, err := s.KVEventsAddrs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dealer := zmq4.NewDealer(ctx)
	defer dealer.Close()
	if err := dealer.Dial(replayAddr); err != nil {
		t.Fatal(err)
	}
	if err := dealer.Send(zmq4.NewMsgFrom([]byte{}, binary.BigEndian.AppendUint64(nil, 0))); err != nil {
		t.Fatal(err)
	}
	var out [][][]byte
	for {
		r, err := dealer.Recv()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r.Frames)
		if len(r.Frames) >= 3 && binary.BigEndian.Uint64(r.Frames[2]) == endSeq {
			return out
		}
	}
}

func TestKVEventsConfig(t *testing.T) {
	c, err := ParseKVEventsConfig(`{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": "t"}`)
	if err != nil || !c.enabled() || c.BufferSteps != 10000 || c.HWM != 100000 || c.Publisher != "zmq" {
		t.Fatalf("%+v %v", c, err)
	}
	if c.BufferBytes != DefaultBufferBytes || c.QueueBytes != DefaultQueueBytes || DefaultBufferBytes != 64<<20 {
		t.Fatalf("byte bounds %d, %d: want the defaults, 64 MiB", c.BufferBytes, c.QueueBytes)
	}
	// The byte bounds are engine-sim's, not vLLM's: not in the JSON.
	for _, bad := range []string{`{"enable_kv_cache_events": true, "bogus": 1}`, `{"buffer_bytes": 1}`, `{"queue_bytes": 1}`} {
		if _, err := ParseKVEventsConfig(bad); err == nil {
			t.Fatalf("unknown key accepted: %s", bad)
		}
	}
	if _, err := (KVEventsConfig{BufferBytes: -1}).withDefaults(); err == nil {
		t.Fatal("negative buffer bytes accepted")
	}
	for _, tc := range []struct {
		ep   string
		bind bool
		r1   string
	}{
		{"tcp://*:5557", true, "tcp://*:5558"},
		{"tcp://[::]:5557", true, "tcp://[::]:5558"},
		{"tcp://router:5557", false, "tcp://router:5558"},
		{"ipc:///tmp/x", true, ""},
		{"inproc://ev", true, "inproc://ev_dp1"},
	} {
		if got := shouldBind(tc.ep); got != tc.bind {
			t.Errorf("shouldBind(%q) = %v", tc.ep, got)
		}
		r1, err := offsetEndpoint(tc.ep, 1)
		if r1 != tc.r1 || (tc.r1 == "") != (err != nil) {
			t.Errorf("offsetEndpoint(%q, 1) = %q, %v", tc.ep, r1, err)
		}
	}
}

// TestBoundPublisherSubscribersLeave: a PUB that binds (the endpoint has
// "::", vLLM's rule) serves subscribers that come and go, then shuts down
// cleanly. It must not auto-reconnect: zmq4 would re-dial its own listen
// address each time a subscriber leaves, racing with Close (caught by
// -race in the demo).
func TestBoundPublisherSubscribersLeave(t *testing.T) {
	if ln, err := net.Listen("tcp", "[::1]:0"); err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	} else {
		ln.Close()
	}
	s := startServer(t, Config{
		KVEvents: KVEventsConfig{EnableKVCacheEvents: true, Endpoint: "tcp://[::1]:0", Topic: "kv"},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addr, _, err := s.KVEventsAddrs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if opts := (&publisher{cfg: KVEventsConfig{Endpoint: "tcp://[::1]:0"}}).pubOptions(); len(opts) != 0 {
		t.Fatalf("bound PUB has %d options, want none (no reconnect)", len(opts))
	}
	if opts := (&publisher{cfg: KVEventsConfig{Endpoint: "tcp://127.0.0.1:5557"}}).pubOptions(); len(opts) == 0 {
		t.Fatal("connecting PUB has no reconnect options")
	}
	for round := range 3 {
		sctx, scancel := context.WithCancel(ctx)
		sub := zmq4.NewSub(sctx)
		if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
			t.Fatal(err)
		}
		if err := sub.Dial(addr); err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() { _, err := sub.Recv(); got <- err }()
		received := false
		for i := 0; i < 200 && !received; i++ {
			post(t, s.url+"/v1/completions", map[string]any{"prompt": fmt.Sprintf("round %d request %03d %s", round, i, strings.Repeat("x", 40)), "max_tokens": 1})
			select {
			case err := <-got:
				if err != nil {
					t.Fatalf("round %d: recv: %v", round, err)
				}
				received = true
			case <-time.After(20 * time.Millisecond):
			}
		}
		if !received {
			t.Fatalf("round %d: no batch received", round)
		}
		scancel()
		sub.Close()
	}
}

// TestRestartSeenBySubscriber: kvrouter's own subscriber follows an
// engine-sim that published batches; POST /admin/restart with no request
// after it must reach the consumer as a ResetRestart within a few seconds
// (the sockets close and reopen, the reconnection's replay check finds an
// empty buffer), and the next batch has seq 0. Both wirings: the engine
// binds its PUB and the subscriber dials, and the reverse.
func TestRestartSeenBySubscriber(t *testing.T) {
	for _, subBinds := range []bool{false, true} {
		t.Run(fmt.Sprintf("subscriber_binds=%v", subBinds), func(t *testing.T) {
			endpoint := "tcp://127.0.0.1:0"
			if subBinds { // a free port for the subscriber to bind
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				endpoint = "tcp://" + ln.Addr().String()
				ln.Close()
			}
			s := startServer(t, Config{KVEvents: KVEventsConfig{EnableKVCacheEvents: true, Endpoint: endpoint,
				Bind: !subBinds, ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv"}})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			pubAddr, replayAddr, err := s.KVEventsAddrs(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !subBinds {
				endpoint = pubAddr
			}
			sub, err := kvevents.NewSubscriber(kvevents.SubscriberConfig{Endpoint: endpoint, ReplayEndpoint: replayAddr,
				Topic: "kv", Bind: subBinds, ReconnectMin: 10 * time.Millisecond, ReconnectMax: 50 * time.Millisecond,
				ReplayTimeout: 2 * time.Second, DialTimeout: 2 * time.Second}, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			updates := make(chan kvevents.Update, 1024)
			sctx, scancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- sub.Run(sctx, func(u kvevents.Update) { updates <- u }) }()
			defer func() {
				scancel()
				if err := <-done; err != nil {
					t.Errorf("subscriber: %v", err)
				}
			}()

			// Batches flow (live or replayed) before the restart.
			got := false
			for i := 0; i < 200 && !got; i++ {
				post(t, s.url+"/v1/completions", map[string]any{"prompt": fmt.Sprintf("before %03d %s", i, strings.Repeat("b", 40)), "max_tokens": 1})
				select {
				case u := <-updates:
					got = len(u.Batch.Events) > 0
				case <-time.After(20 * time.Millisecond):
				}
			}
			if !got {
				t.Fatal("no batch before the restart")
			}
			// Drain until 500 ms pass with no update: a batch of before the
			// restart arriving after it would count as one published
			// between the restart and its reset (a fixed 50 ms wait let a
			// loaded machine's late batch through).
			for quiet := time.NewTimer(500 * time.Millisecond); ; {
				select {
				case u := <-updates:
					if u.Reset != kvevents.ResetNone {
						t.Fatalf("reset %v before the restart", u.Reset)
					}
					quiet.Reset(500 * time.Millisecond)
					continue
				case <-quiet.C:
				}
				break
			}

			if r, b := post(t, s.url+"/admin/restart", nil); r.StatusCode != 200 {
				t.Fatalf("restart: %d %s", r.StatusCode, b)
			}
			deadline := time.After(5 * time.Second)
			for reset := false; !reset; {
				select {
				case u := <-updates:
					if u.Reset == kvevents.ResetRestart {
						reset = true
					} else if u.Reset != kvevents.ResetNone || len(u.Batch.Events) > 0 {
						t.Fatalf("before the restart reset: %+v", u)
					}
				case <-deadline:
					t.Fatalf("no restart reset within 5 s of an idle restart; stats %+v", sub.Stats())
				}
			}

			post(t, s.url+"/v1/completions", map[string]any{"prompt": "after " + strings.Repeat("a", 40), "max_tokens": 1})
			select {
			case u := <-updates:
				if u.Seq != 0 || u.Reset != kvevents.ResetNone || len(u.Batch.Events) == 0 || u.Batch.Events[0].Type != vllm.BlockStored {
					t.Fatalf("first update after the restart: %+v", u)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("no batch after the restart")
			}
		})
	}
}
