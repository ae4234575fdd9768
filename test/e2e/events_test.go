package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"kvrouter/internal/vllm"
)

// eventsPub is an in-process engine: a zmq4 PUB bound on a free loopback
// port, publishing batches encoded like vLLM (vllm.AppendBatch, map layout).
type eventsPub struct {
	t    *testing.T
	sock zmq4.Socket
	ep   string
	seq  uint64
}

func newEventsPub(t *testing.T) *eventsPub {
	t.Helper()
	ep := fmt.Sprintf("tcp://127.0.0.1:%d", pickPort(t))
	p := &eventsPub{t: t, sock: zmq4.NewPub(context.Background()), ep: ep}
	if err := p.sock.Listen(ep); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.sock.Close() })
	return p
}

// waitSubscribed waits until a subscriber's subscription has arrived.
func (p *eventsPub) waitSubscribed() {
	p.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(p.sock.(zmq4.Topics).Topics()) == 0 {
		if time.Now().After(deadline) {
			p.t.Fatal("no subscriber within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (p *eventsPub) publish(topic string, ts float64, events ...vllm.Event) {
	p.t.Helper()
	payload, err := vllm.AppendBatch(nil, &vllm.Batch{TS: ts, Events: events}, vllm.LayoutMap)
	if err != nil {
		p.t.Fatal(err)
	}
	seq := binary.BigEndian.AppendUint64(nil, p.seq)
	p.seq++
	if err := p.sock.Send(zmq4.NewMsgFrom([]byte(topic), seq, payload)); err != nil {
		p.t.Fatal(err)
	}
}

type cliResult struct {
	code        int
	out, errout string
}

// syncBuffer is a bytes.Buffer safe to read while the command writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startEvents runs "kvrouter events args..." in the background; out shows
// its stdout so far.
func startEvents(ctx context.Context, args ...string) (res <-chan cliResult, out *syncBuffer) {
	ch := make(chan cliResult, 1)
	out = &syncBuffer{}
	go func() {
		var errb syncBuffer
		code := run(ctx, append([]string{"events"}, args...), stdio{strings.NewReader(""), out, &errb})
		ch <- cliResult{code, out.String(), errb.String()}
	}()
	return ch, out
}

func waitCLI(t *testing.T, ch <-chan cliResult) cliResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(15 * time.Second):
		t.Fatal("kvrouter events did not exit within 15s")
	}
	return cliResult{}
}

func testEvents() (stored, removed, cleared vllm.Event) {
	zero := 0
	stored = vllm.Event{Type: vllm.BlockStored, BlockHashes: []vllm.BlockHash{11, 18446744073709551615},
		TokenIDs: []uint32{1, 2, 3, 4, 5, 6, 7, 8}, BlockSize: 4, Medium: "GPU", GroupIdx: &zero}
	removed = vllm.Event{Type: vllm.BlockRemoved, BlockHashes: []vllm.BlockHash{11}, Medium: "GPU", GroupIdx: &zero}
	cleared = vllm.Event{Type: vllm.AllBlocksCleared}
	return
}

// TestEventsJSON: --count 3 --json prints exactly three event lines (the
// fourth event is not printed), with hashes as decimal strings (one above
// 2^63) and vLLM's field names, then the stats line.
func TestEventsJSON(t *testing.T) {
	p := newEventsPub(t)
	res, _ := startEvents(t.Context(), "--endpoint", p.ep, "--topic", "kv", "--count", "3", "--json")
	p.waitSubscribed()
	stored, removed, cleared := testEvents()
	p.publish("kv-events", 1754530955.5, stored)
	p.publish("kv-events", 1754530956, removed, cleared, removed)
	r := waitCLI(t, res)
	if r.code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", r.code, r.errout)
	}
	want := `{"seq":0,"rank":0,"ts":1754530955.5,"type":"BlockStored","block_hashes":["11","18446744073709551615"],"parent_block_hash":null,"token_ids":[1,2,3,4,5,6,7,8],"block_size":4,"lora_id":null,"medium":"GPU","lora_name":null,"extra_keys":null,"group_idx":0,"kv_cache_spec_kind":null,"kv_cache_spec_sliding_window":null,"locality":null}
{"seq":1,"rank":0,"ts":1754530956,"type":"BlockRemoved","block_hashes":["11"],"medium":"GPU","group_idx":0,"locality":null}
{"seq":1,"rank":0,"ts":1754530956,"type":"AllBlocksCleared"}
{"stats":{"printed":3,"batches":2,"events":4,"blocks_stored":2,"blocks_removed":2,"gaps":0,"replays":0,"replay_errors":0,"unrecoverable_gaps":0,"restarts":0,"queue_drops":0,"malformed":0,"duplicates":0,"reconnects":0}}
`
	if r.out != want {
		t.Fatalf("stdout:\n%s\nwant:\n%s", r.out, want)
	}
}

// TestEventsTextUntilCancelled: without --count the command runs until its
// context ends, then prints the stats; a restart is reported on stderr.
func TestEventsTextUntilCancelled(t *testing.T) {
	p := newEventsPub(t)
	ctx, cancel := context.WithCancel(t.Context())
	res, out := startEvents(ctx, "--endpoint", p.ep)
	p.waitSubscribed()
	stored, removed, cleared := testEvents()
	lora := "adapter-1"
	stored.LoRAName = &lora
	parent := vllm.BlockHash(7)
	stored.ParentBlockHash = &parent
	p.publish("", 1754530955.25, stored, removed)
	p.seq = 0 // the engine restarted
	p.publish("", 1754530957, cleared)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "AllBlocksCleared") {
		if time.Now().After(deadline) {
			t.Fatalf("restart batch not printed; stdout so far:\n%s", out.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	r := waitCLI(t, res)
	if r.code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", r.code, r.errout)
	}
	want := `seq=0 rank=0 ts=1754530955.250 BlockStored hashes=11,18446744073709551615 parent=7 tokens=8 block_size=4 lora="adapter-1" medium=GPU group=0
seq=0 rank=0 ts=1754530955.250 BlockRemoved hashes=11 medium=GPU group=0
seq=0 rank=0 ts=1754530957.000 AllBlocksCleared
stats: printed=3 batches=2 events=3 blocks_stored=2 blocks_removed=1 gaps=0 replays=0 replay_errors=0 unrecoverable_gaps=0 restarts=1 queue_drops=0 malformed=0 duplicates=0 reconnects=0
`
	if r.out != want {
		t.Fatalf("stdout:\n%s\nwant:\n%s", r.out, want)
	}
	if !strings.Contains(r.errout, "reason=restart") {
		t.Fatalf("stderr lacks the restart notice:\n%s", r.errout)
	}
}

func TestEventsUsage(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{nil, "--endpoint is required"},
		{[]string{"--endpoint", "tcp://*:5557"}, `cannot dial host "*"`},
		{[]string{"--endpoint", "tcp://h:1", "--count", "-1"}, "--count -1"},
		{[]string{"--endpoint", "tcp://h:1", "--dp-size", "-1"}, "dp_size -1"},
		{[]string{"--endpoint", "tcp://h:1", "extra"}, "unexpected arguments"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.args), func(t *testing.T) {
			res, _ := startEvents(t.Context(), tt.args...)
			r := waitCLI(t, res)
			if r.code != 2 || !strings.Contains(r.errout, tt.want) {
				t.Fatalf("exit %d, stderr %q; want 2 and %q", r.code, r.errout, tt.want)
			}
		})
	}
}
