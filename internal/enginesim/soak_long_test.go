package enginesim

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// longPromptBody is a completion request for n unique token ids in
// [65536, 128256): 5 bytes each in msgpack, the size of most of a Llama-3
// prompt's ids.
func longPromptBody(rng *rand.Rand, n int) []byte {
	b := append(make([]byte, 0, 8*n+64), `{"max_tokens":1,"prompt":[`...)
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, 65536+rng.Uint64N(128256-65536), 10)
	}
	return append(b, "]}"...)
}

// liveHeap is the Go heap in use after a full collection: the bytes still
// reachable, which is what an unbounded buffer grows.
func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// rssKiB is the process's resident set from /proc/self/status (0 where that
// does not exist), logged beside the live heap.
func rssKiB() int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for l := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	return 0
}

// TestSoakLongPrompts sends 20K-token prompts (unique, so every step stores
// 512 blocks and, once the 4,096-block cache is full, evicts as many) to
// an engine with KV events and replay on, and checks that the live heap
// stays flat while the replay buffer holds at most BufferBytes: the buffer
// used to keep every batch until 2 x buffer_steps (20,000 batches of
// ~80 KB of encoding in ~175 KB buffers here) and an engine-sim took 5-6 GB.
//
// It asserts on the live Go heap after runtime.GC, not on RSS: RSS also
// holds freed memory the runtime has not yet returned to the OS and, under
// -race, the race detector's shadow memory, so it moves with GOGC and
// scavenger timing; the live heap is exactly what the process retains,
// and at steady state RSS is about (1 + GOGC/100) times it. RSS is logged.
// KVROUTER_SOAK_LONG=N sends N requests after warm-up instead of 150.
func TestSoakLongPrompts(t *testing.T) {
	const (
		promptTokens = 20000
		clients      = 4
		bound        = 8 << 20 // BufferBytes; warm-up fills it
		warmup       = 60      // ~145 batches of ~80 KB: the buffer is full
	)
	after := 150
	if v := os.Getenv("KVROUTER_SOAK_LONG"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("KVROUTER_SOAK_LONG: %v", err)
		}
		after = n
	}
	if testing.Short() {
		// Still more batches after warm-up than the bound holds (~106),
		// so the buffer must have dropped some: 40 published only ~98.
		after = 60
	}
	s := startServer(t, Config{
		Core: CoreConfig{NumGPUBlocks: 4096, MaxModelLen: 32768},
		KVEvents: KVEventsConfig{EnableKVCacheEvents: true, Endpoint: "tcp://127.0.0.1:0", Bind: true,
			ReplayEndpoint: "tcp://127.0.0.1:0", BufferBytes: bound},
	})
	tr := &http.Transport{MaxIdleConnsPerHost: clients}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	send := func(n int, seed uint64) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, clients)
		for c := range clients {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(seed, uint64(c)))
				for range n / clients {
					resp, err := hc.Post(s.url+"/v1/completions", "application/json", bytes.NewReader(longPromptBody(rng, promptTokens)))
					if err != nil {
						errs <- err
						return
					}
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 || !bytes.Contains(body, []byte(`"prompt_tokens":20000`)) {
						errs <- fmt.Errorf("status %d: %.200s", resp.StatusCode, body)
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	base := liveHeap()
	start := time.Now()
	send(warmup, 1)
	early, earlyRSS := liveHeap(), rssKiB()
	s.pub.mu.Lock()
	earlySeq := s.pub.next
	s.pub.mu.Unlock()
	send(after, 2)
	late, lateRSS := liveHeap(), rssKiB()

	s.pub.mu.Lock()
	n, held, next := s.pub.buf.n, s.pub.buf.bytes, s.pub.next
	s.pub.mu.Unlock()
	t.Logf("%d requests of %d tokens in %v: %d batches published, %d in the replay buffer (%d KiB, bound %d KiB); live heap %d KiB idle, %d -> %d KiB, RSS %d -> %d MiB",
		warmup+after, promptTokens, time.Since(start).Round(time.Millisecond), next, n, held>>10, bound>>10, base>>10, early>>10, late>>10, earlyRSS>>10, lateRSS>>10)
	if late > early+16<<20 {
		t.Fatalf("live heap grew from %d MiB to %d MiB over %d requests of %d tokens", early>>20, late>>20, after, promptTokens)
	}
	// What the buffer retains is what it counts: its payloads are
	// exact-size copies, not encoding buffers sized by an upper bound
	// (which were ~2.4x the encoding here).
	if late > base+bound+bound/2 {
		t.Fatalf("live heap %d KiB with a full replay buffer of %d KiB, %d KiB idle: the buffer retains more than it counts", late>>10, held>>10, base>>10)
	}
	if held > bound || n == 0 || uint64(n) >= next-earlySeq {
		t.Fatalf("replay buffer holds %d batches, %d bytes: want at most %d bytes and fewer than the %d published after warm-up", n, held, bound, next-earlySeq)
	}

	// A replay from 0 answers the newest batches only, contiguous up to the
	// last one published, within the bound.
	var seqs []uint64
	var replayed int64
	for _, f := range replayFrames(t, s) {
		if seq := binary.BigEndian.Uint64(f[2]); seq != endSeq {
			seqs = append(seqs, seq)
			replayed += int64(len(f[3])) + replayItemSize
		}
	}
	if len(seqs) != n || seqs[0] == 0 || seqs[len(seqs)-1] != next-1 || replayed > bound {
		t.Fatalf("replay: %d batches from %d to %d, %d bytes; want %d ending at %d within %d bytes", len(seqs), seqs[0], seqs[len(seqs)-1], replayed, n, next-1, bound)
	}
	for i := 1; i < len(seqs); i++ {
		if seqs[i] != seqs[i-1]+1 {
			t.Fatalf("replayed seqs not contiguous at %d: %d then %d", i, seqs[i-1], seqs[i])
		}
	}
}
