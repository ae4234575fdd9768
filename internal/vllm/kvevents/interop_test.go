package kvevents

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"kvrouter/internal/vllm"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The interop tests run testdata/zmqpub/publisher.py, a libzmq PUB/ROUTER
// that publishes exactly like vLLM, under Debian's /usr/bin/python3 (whose
// python3-zmq and python3-msgpack CI installs).

const (
	pythonBin   = "/usr/bin/python3"
	publisherPy = "../../../testdata/zmqpub/publisher.py"
)

var (
	pythonOnce sync.Once
	pythonErr  error
)

// needPython skips the test under -short (make check needs no system
// packages) and fails it when Debian's python3 cannot import zmq and msgpack.
func needPython(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: needs Debian's python3-zmq and python3-msgpack")
	}
	pythonOnce.Do(func() {
		out, err := exec.Command(pythonBin, "-c", "import zmq, msgpack").CombinedOutput()
		if err != nil {
			pythonErr = fmt.Errorf("%v: %s", err, out)
		}
	})
	if pythonErr == nil {
		return
	}
	t.Fatalf("libzmq interop test needs %s with pyzmq and msgpack (apt-get install python3-zmq python3-msgpack): %v", pythonBin, pythonErr)
}

// pyPub is a running publisher.py.
type pyPub struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr *strings.Builder
	mu     sync.Mutex
	pub    string // bound PUB endpoint
	replay string // bound ROUTER endpoint or "none"
	done   chan struct{}
}

// startPyPub starts publisher.py with args and waits for its "ready" line.
func startPyPub(t *testing.T, args ...string) *pyPub {
	t.Helper()
	needPython(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	p := &pyPub{t: t, lines: make(chan string, 16), stderr: &strings.Builder{}, done: make(chan struct{})}
	p.cmd = exec.CommandContext(ctx, pythonBin, append([]string{publisherPy}, args...)...)
	p.cmd.Stderr = lockedWriter{&p.mu, p.stderr}
	var err error
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start publisher: %v", err)
	}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	go func() {
		p.cmd.Wait()
		cancel()
		close(p.done)
	}()
	t.Cleanup(func() { p.stop() })
	ready := p.line("ready")
	for _, f := range strings.Fields(ready)[1:] {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "pub":
			p.pub = v
		case "replay":
			p.replay = v
		}
	}
	return p
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

func (p *pyPub) line(prefix string) string {
	p.t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok || !strings.HasPrefix(l, prefix) {
			p.mu.Lock()
			defer p.mu.Unlock()
			p.t.Fatalf("publisher: want %q line, got %q (closed=%v); stderr:\n%s", prefix, l, !ok, p.stderr)
		}
		return l
	case <-time.After(10 * time.Second):
		p.t.Fatalf("publisher: no %q line within 10s", prefix)
	}
	return ""
}

// do sends one command and returns the next seq the publisher will use.
func (p *pyPub) do(cmd string) uint64 {
	p.t.Helper()
	if _, err := io.WriteString(p.stdin, cmd+"\n"); err != nil {
		p.t.Fatalf("publisher %q: %v", cmd, err)
	}
	l := p.line("ok next=")
	n, err := strconv.ParseUint(strings.TrimPrefix(l, "ok next="), 10, 64)
	if err != nil {
		p.t.Fatalf("publisher reply %q: %v", l, err)
	}
	return n
}

// stop ends the process (idempotent) and waits for it.
func (p *pyPub) stop() {
	p.stdin.Close() // EOF on stdin makes publisher.py exit
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// pyEvents is what publisher.py publishes for (epoch, seq): see its doc.
func pyEvents(epoch, seq uint64) []vllm.Event {
	h := func(s, i uint64) vllm.BlockHash { return vllm.BlockHash(epoch<<48 | s<<8 | i) }
	gpu, zero := "GPU", 0
	_ = gpu
	switch seq % 4 {
	case 0:
		tok := make([]uint32, 8)
		for i := range tok {
			tok[i] = uint32(seq%1000) + uint32(i)
		}
		return []vllm.Event{{Type: vllm.BlockStored, BlockHashes: []vllm.BlockHash{h(seq, 0), h(seq, 1)}, TokenIDs: tok,
			BlockSize: 4, Medium: "GPU", GroupIdx: &zero}}
	case 1:
		return []vllm.Event{{Type: vllm.BlockRemoved, BlockHashes: []vllm.BlockHash{h(seq, 0)}, Medium: "GPU", GroupIdx: &zero}}
	case 2:
		var parent *vllm.BlockHash
		if p := h(seq-2, 0); p != 0 { // 0 (epoch 0, seq 2) decodes as no parent
			parent = &p
		}
		return []vllm.Event{{Type: vllm.BlockStored, BlockHashes: []vllm.BlockHash{h(seq, 0) | 1<<63}, ParentBlockHash: parent,
			TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 4, Medium: "CPU"}}
	}
	return []vllm.Event{{Type: vllm.AllBlocksCleared}}
}

func pyTS(epoch, seq uint64) float64 { return 1754530955.0 + float64(epoch)*1000 + float64(seq)/2 }

// checkPyUpdate asserts u is seq of epoch with the given reset.
func checkPyUpdate(t *testing.T, u Update, epoch, seq uint64, reset ResetReason) {
	t.Helper()
	if u.Seq != seq || u.Reset != reset {
		t.Fatalf("update seq=%d reset=%v replayed=%v, want seq=%d reset=%v", u.Seq, u.Reset, u.Replayed, seq, reset)
	}
	if u.Batch.TS != pyTS(epoch, seq) {
		t.Fatalf("seq %d: ts %v, want %v (epoch %d)", seq, u.Batch.TS, pyTS(epoch, seq), epoch)
	}
	if u.Batch.DataParallelRank != u.Rank {
		t.Fatalf("seq %d: payload rank %d on subscription rank %d", seq, u.Batch.DataParallelRank, u.Rank)
	}
	want := pyEvents(epoch, seq)
	if len(u.Batch.Events) != len(want) {
		t.Fatalf("seq %d: %d events, want %d", seq, len(u.Batch.Events), len(want))
	}
	for i := range want {
		if d := diffEvent(u.Batch.Events[i], want[i]); d != "" {
			t.Fatalf("seq %d event %d: %s", seq, i, d)
		}
	}
}

// diffEvent compares the fields publisher.py sets.
func diffEvent(got, want vllm.Event) string {
	switch {
	case got.Type != want.Type:
		return fmt.Sprintf("type %v, want %v", got.Type, want.Type)
	case !slices.Equal(got.BlockHashes, want.BlockHashes):
		return fmt.Sprintf("block_hashes %v, want %v", got.BlockHashes, want.BlockHashes)
	case (got.ParentBlockHash == nil) != (want.ParentBlockHash == nil) ||
		got.ParentBlockHash != nil && *got.ParentBlockHash != *want.ParentBlockHash:
		return fmt.Sprintf("parent %v, want %v", got.ParentBlockHash, want.ParentBlockHash)
	case !slices.Equal(got.TokenIDs, want.TokenIDs):
		return fmt.Sprintf("token_ids %v, want %v", got.TokenIDs, want.TokenIDs)
	case got.BlockSize != want.BlockSize || got.Medium != want.Medium || got.Group() != want.Group():
		return fmt.Sprintf("block_size/medium/group %d/%q/%d, want %d/%q/%d",
			got.BlockSize, got.Medium, got.Group(), want.BlockSize, want.Medium, want.Group())
	}
	return ""
}

// checkResetOnly asserts u is a reset without a batch (see Update).
func checkResetOnly(t *testing.T, u Update, rank int, reset ResetReason) {
	t.Helper()
	if u.Reset != reset || u.Rank != rank || u.Seq != 0 || u.Replayed || len(u.Batch.Events) != 0 ||
		u.Batch.TS != 0 || u.Batch.DataParallelRank != rank {
		t.Fatalf("update %+v, want a %v reset without a batch on rank %d", u, reset, rank)
	}
}

// firstLive publishes one batch at a time until the subscriber delivers
// something, which must be seq from of epoch with no reset, then checks the
// rest of what was published; it returns the publisher's next seq. Batches
// lost before the subscription reached the publisher are caught up by
// replay when a later one arrives.
func firstLive(t *testing.T, p *pyPub, rs *runningSub, epoch, from uint64) uint64 {
	t.Helper()
	for attempt := 0; attempt < 25; attempt++ {
		next := p.do("publish 1")
		if u, ok := rs.tryNext(300 * time.Millisecond); ok {
			checkPyUpdate(t, u, epoch, from, ResetNone)
			for seq := from + 1; seq < next; seq++ {
				checkPyUpdate(t, rs.next(t), epoch, seq, ResetNone)
			}
			return next
		}
	}
	t.Fatalf("subscriber received nothing from the publisher of epoch %d after seq %d", epoch, from)
	return 0
}

// TestInteropPython runs the subscriber against a real libzmq publisher
// (publisher.py) in both replay reply forms and asserts exactly which
// batches and resets the consumer receives: catch-up at start, a gap filled
// by replay, a heartbeat and a 24-byte seq frame, a gap older than the replay
// buffer (unrecoverable), an in-process restart (seq back to 0), and the
// publisher going away and a new idle process taking its ports (reconnect,
// then a restart reset without waiting for a batch).
func TestInteropPython(t *testing.T) {
	for _, form := range []string{"new", "old"} {
		t.Run("replay_form="+form, func(t *testing.T) {
			p := startPyPub(t, "--replay-form", form, "--buffer", "16")
			rs := startSub(t, SubscriberConfig{
				Engine: "py", Endpoint: p.pub, ReplayEndpoint: p.replay, Topic: "kv-events",
				ReconnectMin: 20 * time.Millisecond, ReconnectMax: 200 * time.Millisecond,
			})
			m := rs.s.m

			// Start: the subscriber connects (and finds nothing to catch up);
			// publish until it sees something. A batch lost before the
			// subscription reached the publisher is caught up by replay when
			// the next one arrives, so the consumer gets every batch from
			// seq 0 on, once, in order, no reset.
			next := firstLive(t, p, rs, 0, 0)
			rs.none(t)
			if st := rs.s.Stats(); st.Gaps != 0 || st.UnrecoverableGaps != 0 || st.Restarts != 0 {
				t.Fatalf("after start: %+v", st)
			}

			// Gap filled by replay: 3 batches never sent live.
			from := next
			p.do("drop 3")
			next = p.do("publish 1")
			for seq := from; seq < next; seq++ {
				u := rs.next(t)
				checkPyUpdate(t, u, 0, seq, ResetNone)
				if seq < next-1 && !u.Replayed {
					t.Fatalf("seq %d was never sent live but Replayed = false", seq)
				}
			}
			rs.none(t)
			st := rs.s.Stats()
			if st.Gaps != 1 || st.UnrecoverableGaps != 0 || st.Replays < 1 {
				t.Fatalf("after filled gap: %+v", st)
			}

			// Heartbeat (no events) and a 24-byte seq frame.
			next = p.do("heartbeat")
			if u := rs.next(t); u.Seq != next-1 || len(u.Batch.Events) != 0 || u.Batch.TS != pyTS(0, next-1) || u.Reset != ResetNone {
				t.Fatalf("heartbeat update %+v", u)
			}
			next = p.do("seq24")
			checkPyUpdate(t, rs.next(t), 0, next-1, ResetNone)

			// A gap older than the 16-batch buffer: replay starts later than
			// asked, so the state must be dropped; the consumer gets the 16
			// buffered batches, the first carrying ResetGapLost.
			p.do("drop 20")
			next = p.do("publish 1")
			for seq := next - 16; seq < next; seq++ {
				reset := ResetNone
				if seq == next-16 {
					reset = ResetGapLost
				}
				checkPyUpdate(t, rs.next(t), 0, seq, reset)
			}
			rs.none(t)
			st = rs.s.Stats()
			if st.Gaps != 2 || st.UnrecoverableGaps != 1 || st.Restarts != 0 {
				t.Fatalf("after lost gap: %+v", st)
			}

			// Restart in place: seq back to 0, new hashes.
			p.do("restart")
			p.do("publish 2")
			checkPyUpdate(t, rs.next(t), 1, 0, ResetRestart)
			checkPyUpdate(t, rs.next(t), 1, 1, ResetNone)
			rs.none(t)

			// The publisher process goes away; a new, idle one binds the
			// same endpoints. On reconnecting, the subscriber asks for replay
			// from the last applied seq (1): the new process buffers nothing,
			// so the consumer gets a restart reset at once, with no batch.
			p.stop()
			p2 := startPyPub(t, "--replay-form", form, "--buffer", "16", "--pub", p.pub, "--replay", p.replay, "--epoch", "2")
			checkResetOnly(t, rs.next(t), 0, ResetRestart)
			if st := rs.s.Stats(); st.Reconnects != 1 {
				t.Fatalf("after reconnect: %+v", st)
			}
			// Its batches then apply from seq 0 with no further reset (a seq
			// 0 lost before the subscription reached the new process is
			// caught up by replay when seq 1 arrives).
			firstLive(t, p2, rs, 2, 0)
			next = p2.do("publish 2")
			for seq := next - 2; seq < next; seq++ {
				checkPyUpdate(t, rs.next(t), 2, seq, ResetNone)
			}
			rs.none(t)

			st = rs.s.Stats()
			if st.Restarts != 2 || st.UnrecoverableGaps != 1 || st.Gaps != 2 || st.Malformed != 0 || st.QueueDrops != 0 {
				t.Fatalf("final stats %+v", st)
			}
			if got := counterValue(t, m.restarts, "py", "0"); got != 2 {
				t.Fatalf("kvrouter_vllm_restarts_total = %v, want 2", got)
			}
			if got := counterValue(t, m.unrecoverable, "py", "0"); got != 1 {
				t.Fatalf("kvrouter_vllm_unrecoverable_gaps_total = %v, want 1", got)
			}
			rs.stop(t)
			p2.stop()
		})
	}
}
