package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"kvrouter/internal/vllm"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"kvrouter/internal/testwait"
)

// Frames captured from vLLM's ZmqEventPublisher (testdata/vllm/frames.md §1, §3).
const (
	hexTopic     = "6b762d6576656e7473" // "kv-events"
	hexRemoved1  = "93cb41da250122e000009184a474797065ac426c6f636b52656d6f766564ac626c6f636b5f686173686573910ba66d656469756da3475055a967726f75705f6964780000"
	hexCleared2  = "93cb41da2501232000009181a474797065b0416c6c426c6f636b73436c656172656400"
	hexClearedE0 = "93cb41da250123a000009181a474797065b0416c6c426c6f636b73436c656172656400" // empty-topic example
	hexEnd       = "ffffffffffffffff"
)

// hexFrames turns frames.md notation (hex strings, "" for empty) into frames.
func hexFrames(t testing.TB, hs ...string) [][]byte {
	t.Helper()
	out := make([][]byte, len(hs))
	for i, h := range hs {
		b, err := hex.DecodeString(h)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = b
	}
	return out
}

func TestParseReplay(t *testing.T) {
	tests := []struct {
		name    string
		frames  []string
		topic   string // "-": none (old form)
		seq     uint64
		payload string
		end     bool
		err     bool
	}{
		{"new form data", []string{"", hexTopic, "0000000000000001", hexRemoved1}, hexTopic, 1, hexRemoved1, false, false},
		{"new form end marker", []string{"", "", hexEnd, ""}, "", endSeq, "", true, false},
		{"new form data with empty topic", []string{"", "", "0000000000000000", hexClearedE0}, "", 0, hexClearedE0, false, false},
		{"old form data", []string{"", "0000000000000002", hexCleared2}, "-", 2, hexCleared2, false, false},
		{"old form end marker", []string{"", hexEnd, ""}, "-", endSeq, "", true, false},
		{"seq ff..ff with a payload is data", []string{"", hexEnd, hexCleared2}, "-", endSeq, hexCleared2, false, false},
		{"24-byte seq frame", []string{"", hexTopic, "0000000000000007" + strings.Repeat("ab", 16), hexCleared2}, hexTopic, 7, hexCleared2, false, false},
		{"no delimiter", []string{hexTopic, "0000000000000001", hexRemoved1}, "", 0, "", false, true},
		{"too few frames", []string{"", "0000000000000001"}, "", 0, "", false, true},
		{"too many frames", []string{"", "", hexTopic, "0000000000000001", hexRemoved1}, "", 0, "", false, true},
		{"short seq", []string{"", "00000001", hexRemoved1}, "", 0, "", false, true},
		{"empty", nil, "", 0, "", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			topic, seq, payload, end, err := parseReplay(hexFrames(t, tt.frames...))
			if tt.err {
				if err == nil || !errors.Is(err, errReplayProtocol) {
					t.Fatalf("err = %v, want errReplayProtocol", err)
				}
				return
			}
			if err != nil || seq != tt.seq || end != tt.end || hex.EncodeToString(payload) != tt.payload {
				t.Fatalf("= %d, %x, %v, %v; want %d, %s, %v", seq, payload, end, err, tt.seq, tt.payload, tt.end)
			}
			if tt.topic == "-" {
				if topic != nil {
					t.Fatalf("old form: topic %x, want nil", topic)
				}
			} else if topic == nil || hex.EncodeToString(topic) != tt.topic {
				t.Fatalf("topic %x (nil %v), want %s", topic, topic == nil, tt.topic)
			}
		})
	}
}

func TestParseLive(t *testing.T) {
	tests := []struct {
		name   string
		frames []string
		prefix string
		seq    uint64
		err    string
	}{
		{"captured seq 1", []string{hexTopic, "0000000000000001", hexRemoved1}, "kv", 1, ""},
		{"empty topic, empty filter", []string{"", "0000000000000000", hexClearedE0}, "", 0, ""},
		{"24-byte seq frame (PR #57789)", []string{hexTopic, "0000000000000009" + strings.Repeat("01", 16), hexCleared2}, "", 9, ""},
		{"topic filter is a prefix match", []string{hexTopic, "0000000000000001", hexRemoved1}, "kv-x", 0, "does not match"},
		{"short seq", []string{hexTopic, "0001", hexRemoved1}, "", 0, "seq frame of 2 bytes"},
		{"two frames", []string{"0000000000000001", hexRemoved1}, "", 0, "2 frames"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seq, _, err := parseLive(hexFrames(t, tt.frames...), tt.prefix)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || seq != tt.seq {
				t.Fatalf("= %d, %v; want %d", seq, err, tt.seq)
			}
		})
	}
}

// FuzzParseReplay feeds arbitrary multipart messages (frames separated by
// 0x00 0xff in the input) to both frame parsers: no panic, and an end
// marker always has seq ff..ff and an empty payload.
func FuzzParseReplay(f *testing.F) {
	join := func(hs ...string) []byte { return bytes.Join(hexFrames(f, hs...), []byte{0, 0xff}) }
	f.Add(join("", hexTopic, "0000000000000001", hexRemoved1))
	f.Add(join("", "", hexEnd, ""))
	f.Add(join("", "0000000000000002", hexCleared2))
	f.Add(join("", hexEnd, ""))
	f.Add(join(hexTopic, "0000000000000001", hexRemoved1))
	f.Fuzz(func(t *testing.T, in []byte) {
		frames := bytes.Split(in, []byte{0, 0xff})
		topic, seq, payload, end, err := parseReplay(frames)
		if err == nil && (topic == nil) != (len(frames) == 3) {
			t.Fatalf("%d frames: topic %x (nil %v)", len(frames), topic, topic == nil)
		}
		if err == nil && end && (seq != endSeq || len(payload) != 0) {
			t.Fatalf("end marker with seq %x payload %x", seq, payload)
		}
		if err != nil && !errors.Is(err, errReplayProtocol) {
			t.Fatalf("error %v does not wrap errReplayProtocol", err)
		}
		if _, _, err := parseLive(frames, "kv"); err == nil && (len(frames) != 3 || len(frames[1]) < 8) {
			t.Fatalf("parseLive accepted %d frames", len(frames))
		}
	})
}

// goRouter is an in-process engine replay endpoint: a zmq4 ROUTER bound on
// 127.0.0.1 whose replies to each request come from handle.
type goRouter struct {
	sock zmq4.Socket
	ep   string
	reqs chan [][]byte
	wg   sync.WaitGroup
}

func newGoRouter(t *testing.T, port int, handle func(req [][]byte) [][][]byte) *goRouter {
	t.Helper()
	r := &goRouter{sock: zmq4.NewRouter(context.Background()), ep: fmt.Sprintf("tcp://127.0.0.1:%d", port), reqs: make(chan [][]byte, 16)}
	if err := r.sock.Listen(r.ep); err != nil {
		t.Fatal(err)
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			msg, err := r.sock.Recv()
			if err != nil {
				return
			}
			id, req := msg.Frames[0], msg.Frames[1:]
			select {
			case r.reqs <- req:
			default:
			}
			for _, reply := range handle(req) {
				if err := r.sock.Send(zmq4.NewMsgFrom(append([][]byte{id}, reply...)...)); err != nil {
					return
				}
			}
		}
	}()
	t.Cleanup(func() { r.sock.Close(); r.wg.Wait() })
	return r
}

// TestReplayCapturedReplies: the replay client sends ["", seq8] through a
// DEALER (the ROUTER sees [id, "", seq8], the only shape vLLM accepts) and
// reads the captured replies of both forms up to the end marker.
func TestReplayCapturedReplies(t *testing.T) {
	forms := map[string][][]string{
		"new": {{"", hexTopic, "0000000000000001", hexRemoved1}, {"", hexTopic, "0000000000000002", hexCleared2}, {"", "", hexEnd, ""}},
		"old": {{"", "0000000000000001", hexRemoved1}, {"", "0000000000000002", hexCleared2}, {"", hexEnd, ""}},
	}
	for name, replies := range forms {
		t.Run(name, func(t *testing.T) {
			port := freePorts(t, 1)
			r := newGoRouter(t, port, func([][]byte) [][][]byte {
				var out [][][]byte
				for _, rep := range replies {
					out = append(out, hexFrames(t, rep...))
				}
				return out
			})
			ep, _ := parseEndpoint(r.ep, 0, false)
			rp := &replayer{ep: ep, timeout: 5 * time.Second}
			var got []string
			res, err := rp.replay(context.Background(), 0, func(seq uint64, payload []byte) error {
				b, err := vllm.DecodeBatch(payload)
				if err != nil {
					return err
				}
				got = append(got, fmt.Sprintf("%d:%v", seq, b.Events[0].Type))
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if res.batches != 2 || res.first != 1 || res.last != 2 || strings.Join(got, ",") != "1:BlockRemoved,2:AllBlocksCleared" {
				t.Fatalf("result %+v, batches %v", res, got)
			}
			req := <-r.reqs
			if len(req) != 2 || len(req[0]) != 0 || hex.EncodeToString(req[1]) != "0000000000000000" {
				t.Fatalf("ROUTER saw request %x, want [\"\", seq8]", req)
			}
		})
	}
}

// TestReplayTimeout: an engine that never answers costs at most the replay
// timeout; the gap is then unrecoverable and the live batch that revealed it
// carries ResetGapLost. (The catch-up replay on connecting also times out;
// the consumer held nothing then, so nothing is reset.)
func TestReplayTimeout(t *testing.T) {
	base := freePorts(t, 2)
	newGoRouter(t, base+1, func([][]byte) [][][]byte { return nil }) // silent
	g := newGoPub(t, "", base, 1, false)
	rs := startSub(t, SubscriberConfig{
		Engine: "e-silent", Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base),
		ReplayEndpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base+1), ReplayTimeout: 200 * time.Millisecond,
	})
	g.waitSubscribed()
	g.publish(0, false)
	checkGoUpdate(t, rs.next(t), 0, 0, ResetNone)
	g.publish(0, true)
	start := time.Now()
	g.publish(0, false)
	checkGoUpdate(t, rs.next(t), 0, 2, ResetGapLost)
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("gap handling took %v with a 200ms replay timeout", d)
	}
	g.publish(0, false)
	checkGoUpdate(t, rs.next(t), 0, 3, ResetNone)
	if st := rs.s.Stats(); st.Gaps != 1 || st.Replays != 2 || st.ReplayErrors != 2 || st.UnrecoverableGaps != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestReplayBadReply: a reply of neither shape ends the replay with an
// error; what came before it is kept, the rest of the gap is lost.
func TestReplayBadReply(t *testing.T) {
	base := freePorts(t, 2)
	newGoRouter(t, base+1, func(req [][]byte) [][][]byte {
		if binary.BigEndian.Uint64(req[1]) == 0 { // catch-up on connecting: nothing buffered yet
			return [][][]byte{{nil, nil, seq8(endSeq), nil}}
		}
		return [][][]byte{
			{nil, []byte("kv"), seq8(1), testPayload(t, 0, 1)},
			{nil, []byte("kv"), []byte("x"), seq8(2), nil}, // 5 frames
		}
	})
	g := newGoPub(t, "", base, 1, false)
	rs := startSub(t, SubscriberConfig{
		Engine: "e-bad", Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base),
		ReplayEndpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base+1),
	})
	g.waitSubscribed()
	g.publish(0, false)
	checkGoUpdate(t, rs.next(t), 0, 0, ResetNone)
	g.publish(0, true)
	g.publish(0, true)
	g.publish(0, false)
	u := rs.next(t)
	checkGoUpdate(t, u, 0, 1, ResetNone)
	if !u.Replayed {
		t.Fatal("seq 1 not marked replayed")
	}
	checkGoUpdate(t, rs.next(t), 0, 3, ResetGapLost)
	rs.none(t)
	if st := rs.s.Stats(); st.ReplayErrors != 1 || st.UnrecoverableGaps != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestReplayCatchUpAtStart: connecting triggers a replay from 0; the
// consumer gets the engine's buffered history first, with no reset (it had
// no state to lose), and the live batch it already has is a duplicate.
func TestReplayCatchUpAtStart(t *testing.T) {
	base := freePorts(t, 2)
	newGoRouter(t, base+1, func(req [][]byte) [][][]byte {
		var out [][][]byte
		for s := uint64(2); s <= 4; s++ { // the engine buffers seqs 2..4 only
			out = append(out, [][]byte{nil, nil, seq8(s), testPayload(t, 0, s)})
		}
		return append(out, [][]byte{nil, nil, seq8(endSeq), nil})
	})
	g := newGoPub(t, "", base, 1, false)
	g.seq[0] = 4
	rs := startSub(t, SubscriberConfig{
		Engine: "e-late", Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base),
		ReplayEndpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base+1),
	})
	g.waitSubscribed()
	g.publish(0, false) // 4
	for s := uint64(2); s <= 4; s++ {
		checkGoUpdate(t, rs.next(t), 0, s, ResetNone)
	}
	g.publish(0, false)
	checkGoUpdate(t, rs.next(t), 0, 5, ResetNone)
	rs.none(t)
	if st := rs.s.Stats(); st.Gaps != 0 || st.UnrecoverableGaps != 0 || st.Replays != 1 || st.Duplicates != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestIdleCheckReplaysTrailingDrops: the live stream drops the last batches
// of a burst (seqs 3 and 4) and the engine then goes idle, so no later live
// batch reveals the gap; after IdleCheck the subscriber asks the replay
// endpoint from the last applied seq and delivers them. While idle and
// caught up it keeps checking without delivering anything.
func TestIdleCheckReplaysTrailingDrops(t *testing.T) {
	base := freePorts(t, 2)
	var mu sync.Mutex
	published := uint64(0) // the engine's buffer holds seqs 0..published-1
	router := newGoRouter(t, base+1, func(req [][]byte) [][][]byte {
		from := binary.BigEndian.Uint64(req[len(req)-1])
		mu.Lock()
		defer mu.Unlock()
		var out [][][]byte
		for s := from; s < published; s++ {
			out = append(out, [][]byte{nil, nil, seq8(s), testPayload(t, 0, s)})
		}
		return append(out, [][]byte{nil, nil, seq8(endSeq), nil})
	})
	g := newGoPub(t, "", base, 1, false)
	rs := startSub(t, SubscriberConfig{
		Engine: "e-idle", Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base),
		ReplayEndpoint: router.ep, IdleCheck: 300 * time.Millisecond,
	})
	g.waitSubscribed()
	for s := range uint64(5) {
		mu.Lock()
		published = s + 1
		mu.Unlock()
		g.publish(0, s >= 3) // 3 and 4 dropped by the live stream
	}
	for s := range uint64(5) {
		u := rs.next(t)
		checkGoUpdate(t, u, 0, s, ResetNone)
		// 3 and 4 can only come by replay. 0..2 are on the live stream,
		// but the connection's own replay from 0 (nothing applied yet)
		// may deliver them first when the machine is loaded; either way
		// each seq is delivered once, in order.
		if s >= 3 && !u.Replayed {
			t.Fatalf("seq %d replayed=%v", s, u.Replayed)
		}
	}
	// Caught up: further idle checks deliver nothing and are not replays.
	testwait.For(t, "two more idle checks", func() bool { return rs.s.Stats().IdleChecks >= 3 })
	rs.none(t)
	// Usually 1 gap and 2 replays (catch-up on connecting, the idle check
	// that delivered); when the connection's catch-up already returned the
	// dropped batches, no gap and 1 replay.
	if st := rs.s.Stats(); st.Gaps > 1 || st.UnrecoverableGaps != 0 || st.Restarts != 0 || st.Replays < 1 || st.Replays > 2 {
		t.Fatalf("stats %+v, want at most 1 gap, none lost, 1 or 2 replays", st)
	}
}

// TestIdleCheckUntrustedReplay: on a standing connection an idle check
// whose replay does not start with the last applied batch (another engine's
// replay endpoint, or an empty replay buffer) changes nothing: no reset, no
// foreign batch, and the next live batch goes on as before.
func TestIdleCheckUntrustedReplay(t *testing.T) {
	for _, mode := range []string{"foreign", "empty"} {
		t.Run(mode, func(t *testing.T) {
			base := freePorts(t, 2)
			var reqs atomic.Int32
			router := newGoRouter(t, base+1, func(req [][]byte) [][][]byte {
				var out [][][]byte
				// Another engine that has published by the time of the
				// first idle check (not yet at the catch-up on connecting).
				if mode == "foreign" && reqs.Add(1) > 1 {
					for s := uint64(0); s < 6; s++ {
						out = append(out, [][]byte{nil, nil, seq8(s), testPayload(t, 1, s)})
					}
				}
				return append(out, [][]byte{nil, nil, seq8(endSeq), nil})
			})
			g := newGoPub(t, "", base, 1, false)
			rs := startSub(t, SubscriberConfig{
				Engine: "e-" + mode, Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base),
				ReplayEndpoint: router.ep, IdleCheck: 150 * time.Millisecond,
			})
			g.waitSubscribed()
			g.publish(0, false)
			g.publish(0, false)
			checkGoUpdate(t, rs.next(t), 0, 0, ResetNone)
			checkGoUpdate(t, rs.next(t), 0, 1, ResetNone)
			// The live copy of a batch the catch-up replay delivered first
			// may still be on its way (a loaded machine): the state to keep
			// is the one at the first idle check. The interval doubles after
			// each untrusted answer: 150, 300, 600 ms.
			testwait.For(t, "one idle check", func() bool { return rs.s.Stats().IdleChecks >= 1 })
			before := rs.s.Stats()
			testwait.For(t, "two more idle checks", func() bool { return rs.s.Stats().IdleChecks >= 3 })
			rs.none(t)
			after := rs.s.Stats()
			if after.Restarts != before.Restarts || after.UnrecoverableGaps != before.UnrecoverableGaps ||
				after.Batches != before.Batches || after.Replays != before.Replays {
				t.Fatalf("an untrusted idle replay changed state: before %+v, after %+v", before, after)
			}
			// The next live batch goes on from the state kept.
			g.publish(0, false)
			checkGoUpdate(t, rs.next(t), 0, 2, ResetNone)
		})
	}
}

// TestReplayTopicFilter: replayed batches pass the topic filter live
// batches pass (SUB filtering is a prefix match): replies of another topic
// are skipped, not delivered and not counted, both by the replayer and by a
// subscriber catching up on connecting.
func TestReplayTopicFilter(t *testing.T) {
	base := freePorts(t, 3)
	replies := func([][]byte) [][][]byte {
		var out [][][]byte
		for s := uint64(0); s < 5; s++ {
			topic := "kv@other" // seqs 0..2: another engine's topic
			if s >= 3 {
				topic = "kv@e1-x" // 3, 4: the subscribed prefix "kv@e1"
			}
			out = append(out, [][]byte{nil, []byte(topic), seq8(s), testPayload(t, 0, s)})
		}
		return append(out, [][]byte{nil, nil, seq8(endSeq), nil})
	}
	// The replayer alone and the subscriber each get a ROUTER of their
	// own: with one shared, the test's zmq4 ROUTER lost its reply to the
	// subscriber's connection, made just after the replayer's closed, in
	// 2 runs of 40 under -race (none in 40 with one each).
	newGoRouter(t, base+1, replies)
	newGoRouter(t, base+2, replies)
	ep, _ := parseEndpoint(fmt.Sprintf("tcp://127.0.0.1:%d", base+2), 0, false)
	rp := &replayer{ep: ep, timeout: 5 * time.Second, topic: "kv@e1"}
	var got []uint64
	res, err := rp.replay(context.Background(), 0, func(seq uint64, _ []byte) error {
		got = append(got, seq)
		return nil
	})
	if err != nil || fmt.Sprint(got) != "[3 4]" || res != (replayResult{batches: 2, first: 3, last: 4, filtered: 3}) {
		t.Fatalf("replayed %v, result %+v, err %v; want [3 4] with 3 filtered", got, res, err)
	}

	g := newGoPub(t, "kv@e1-x", base, 1, false)
	g.seq[0] = 5
	rs := startSub(t, SubscriberConfig{
		Engine: "e-topic", Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base),
		ReplayEndpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base+1), Topic: "kv@e1",
	})
	g.waitSubscribed()
	for s := uint64(3); s <= 4; s++ {
		u := rs.next(t)
		checkGoUpdate(t, u, 0, s, ResetNone)
		if !u.Replayed {
			t.Fatalf("seq %d not replayed", s)
		}
	}
	g.publish(0, false)
	checkGoUpdate(t, rs.next(t), 0, 5, ResetNone)
	rs.none(t)
}

// TestReplayCatchUpShortLoggedAtInfo: a start-up catch-up that cannot
// begin at the requested seq (the engine buffers seqs 2..4 of 0..4) is
// logged at Info with what was lost: requested seq 0, first seq 2, 2
// batches whose blocks stay unknown.
func TestReplayCatchUpShortLoggedAtInfo(t *testing.T) {
	base := freePorts(t, 2)
	newGoRouter(t, base+1, func([][]byte) [][][]byte {
		var out [][][]byte
		for s := uint64(2); s <= 4; s++ {
			out = append(out, [][]byte{nil, nil, seq8(s), testPayload(t, 0, s)})
		}
		return append(out, [][]byte{nil, nil, seq8(endSeq), nil})
	})
	g := newGoPub(t, "", base, 1, false)
	rec := &recordHandler{}
	s, err := NewSubscriber(SubscriberConfig{
		Engine: "e-short", Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base),
		ReplayEndpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base+1),
	}, slog.New(rec), nil)
	if err != nil {
		t.Fatal(err)
	}
	ups := make(chan Update, 16)
	runSubscriber(t, s, func(u Update) { ups <- u })
	g.waitSubscribed()
	for s := uint64(2); s <= 4; s++ {
		checkGoUpdate(t, <-ups, 0, s, ResetNone)
	}
	const msg = "catch-up replay could not start at the requested seq"
	testwait.For(t, "the log line", func() bool { _, ok := rec.find(msg); return ok })
	r, ok := rec.find(msg)
	if !ok || r.Level != slog.LevelInfo || r.attr("requested_seq") != "0" || r.attr("first_seq") != "2" ||
		r.attr("lost_batches") != "2" || r.attr("engine") != "e-short" {
		t.Fatalf("log %+v (found %v), want an Info line with requested_seq 0, first_seq 2, lost_batches 2", r, ok)
	}
}
