package e2e

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"kvrouter/internal/config"
	"kvrouter/internal/kvindex"
	"kvrouter/internal/serve"
)

// startSnapSim runs an engine-sim process with KV events, a replay buffer
// of bufferSteps batches and a small KV cache (blocks are evicted, so the
// events carry removals too).
func startSnapSim(t *testing.T, bin string, bufferSteps, gpuBlocks int) *e2eSim {
	t.Helper()
	ev, rep := e2eFreePort(t), e2eFreePort(t)
	return startSimProc(t, bin, simProcOpts{events: ev, replay: rep, health: true},
		"--served-model-name", "m", "--profile", "fast", "--tokenizer", e2eQwen3Dir,
		"--max-model-len", "4096", "--num-gpu-blocks-override", strconv.Itoa(gpuBlocks),
		"--kv-events-config", kvEventsConfig("*", ev, rep, fmt.Sprintf(`"buffer_steps":%d`, bufferSteps)))
}

// snapRouter is a kvrouter serve run in this process that a test stops
// (and restarts) itself.
type snapRouter struct {
	url  string
	stop func() // stops serve and waits for it (and its shutdown snapshot)
}

func startSnapRouter(t *testing.T, yaml string, name string) *snapRouter {
	t.Helper()
	cfg, pos, err := config.Parse([]byte(yaml), func(string) string { return "" })
	if err != nil {
		t.Fatalf("%v\n%s", err, yaml)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("router", name)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runServe(ctx, serve.Options{Config: cfg, Positions: pos, Log: log}, ln) }()
	var once sync.Once
	r := &snapRouter{url: "http://" + ln.Addr().String()}
	r.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("serve %s: %v", name, err)
			}
		})
	}
	t.Cleanup(r.stop)
	e2eEventually(t, 60*time.Second, "router "+name+" ready", func() bool {
		resp, err := http.Get(r.url + "/ready?full=1")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return r
}

// snapYAML is router.yaml for the sims with a snapshot every 100ms at path.
func snapYAML(path string, sims []*e2eSim) string {
	var b strings.Builder
	fmt.Fprintf(&b, "health: {probe_interval: 200ms, scrape_interval: 200ms}\nsnapshot: {path: %q, interval: 100ms}\n", path)
	b.WriteString("models:\n  - name: m\n    tokenizer: ../../testdata/tokenizer/qwen3\n    engines:\n")
	for i, s := range sims {
		fmt.Fprintf(&b, "      - {name: e%d, url: %q, events: %q, replay: %q, idle_check: 200ms}\n", i, s.url, s.events, s.replay)
	}
	return b.String()
}

func readSnap(path string) ([]*kvindex.Snapshot, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return kvindex.DecodeSnapshots(data)
}

// snapTraffic sends chat requests (20 conversations sharing 4 system
// prompts, growing turn by turn) to url, 6 at a time, until stop is closed.
// While paused is set, no sender starts a request.
func snapTraffic(t *testing.T, url func() string, stop <-chan struct{}, paused *atomic.Bool, sent *atomic.Int64) *sync.WaitGroup {
	var wg sync.WaitGroup
	words := strings.Fields("the router keeps an index of every block each engine holds and sends a prompt where its prefix is cached already while load stays even across replicas")
	for w := range 6 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			client := &http.Client{Timeout: 30 * time.Second}
			for turn := 0; ; turn++ {
				select {
				case <-stop:
					return
				default:
				}
				if paused.Load() {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				conv := rng.IntN(20)
				var sys strings.Builder
				for i := range 150 {
					sys.WriteString(words[(conv%4*7+i)%len(words)] + " ")
				}
				var user strings.Builder
				for i := range 20 + rng.IntN(200) {
					user.WriteString(words[(conv*13+i*i)%len(words)] + " ")
				}
				body := fmt.Sprintf(`{"model":"m","max_tokens":4,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, sys.String(), user.String())
				resp, err := client.Post(url()+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					t.Errorf("request: %v", err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Errorf("request: status %d", resp.StatusCode)
					return
				}
				sent.Add(1)
			}
		})
	}
	return &wg
}

// TestE2ESnapshotRestartIdentical: two routers follow three engine-sim
// processes (real ZeroMQ events and replay; each engine buffers its last
// 400 batches). Router B stops mid-traffic (writing its snapshot), misses
// fewer batches than the engines buffer, and starts again from the
// snapshot while traffic goes on; router A never stops. Once the traffic
// ends, B's index equals A's entry by entry, with the same marks. The
// engines had published more than they buffer before B stopped, so a
// router starting cold could not have caught up: only the snapshot plus
// replay from its marks gives the same index.
func TestE2ESnapshotRestartIdentical(t *testing.T) {
	if testing.Short() {
		t.Skip("starts engine-sim processes")
	}
	bin := e2eBuild(t)
	const buffer = 400
	var sims []*e2eSim
	for range 3 {
		sims = append(sims, startSnapSim(t, bin, buffer, 600))
	}
	dir := t.TempDir()
	pathA, pathB := filepath.Join(dir, "a.snap"), filepath.Join(dir, "b.snap")
	a := startSnapRouter(t, snapYAML(pathA, sims), "A")
	b := startSnapRouter(t, snapYAML(pathB, sims), "B")

	batches := func(engine string) float64 {
		return e2eMetric(t, a.url, "kvrouter_vllm_batches_total", `engine="`+engine+`"`)
	}
	minBatches := func() float64 {
		m := batches("e0")
		for _, e := range []string{"e1", "e2"} {
			m = min(m, batches(e))
		}
		return m
	}
	stop := make(chan struct{})
	var sent atomic.Int64
	var paused atomic.Bool
	traffic := snapTraffic(t, func() string { return a.url }, stop, &paused, &sent)
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		traffic.Wait()
	}()
	e2eEventually(t, 90*time.Second, "every engine past its replay buffer", func() bool { return minBatches() > 1.5*buffer })

	before := map[string]float64{}
	for _, e := range []string{"e0", "e1", "e2"} {
		before[e] = batches(e)
	}
	// The engines must not publish more than they buffer while B is down,
	// however long B takes to stop and start again: the clients pause (each
	// finishes the request it has) and while B is down every engine gets
	// one request straight from the test, so each publishes a few batches
	// B misses, whatever A's routing and the machine's speed.
	paused.Store(true)
	start := time.Now()
	b.stop() // writes its snapshot on the way out
	first, err := readSnap(pathB)
	if err != nil || len(first) != 1 || len(first[0].Engines) != 3 {
		t.Fatalf("B's shutdown snapshot: %v", err)
	}
	stopped := map[string]float64{}
	for i, sim := range sims {
		e := fmt.Sprintf("e%d", i)
		stopped[e] = batches(e)
		body := fmt.Sprintf(`{"model":"m","max_tokens":4,"prompt":"while router B is down, engine %d serves this prompt of its own"}`, i)
		resp, err := http.Post(sim.url+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request to engine %s: status %d", e, resp.StatusCode)
		}
	}
	e2eEventually(t, 30*time.Second, "every engine's batches of B's downtime seen by A", func() bool {
		for e, n := range stopped {
			if batches(e) <= n {
				return false
			}
		}
		return true
	})
	b = startSnapRouter(t, snapYAML(pathB, sims), "B again")
	down := time.Since(start)
	paused.Store(false)
	for _, e := range []string{"e0", "e1", "e2"} {
		missed := batches(e) - before[e]
		t.Logf("engine %s: %v batches before B stopped, %v while it was down (%v)", e, before[e], missed, down.Round(time.Millisecond))
		if missed <= 0 || missed > buffer/2 {
			t.Fatalf("engine %s published %v batches while B was down: want 1..%d (the replay buffer covers the gap)", e, missed, buffer/2)
		}
	}
	// Live traffic after B is back: two more requests per sender, so B
	// applies new batches on top of what it replayed.
	resumed := sent.Load()
	e2eEventually(t, 30*time.Second, "12 requests after B came back", func() bool { return sent.Load() >= resumed+12 })
	close(stop)
	traffic.Wait()
	if t.Failed() {
		return
	}

	// Traffic is over: the two routers' periodic snapshots converge.
	var sa, sb []*kvindex.Snapshot
	e2eEventually(t, 30*time.Second, "B's index equal to A's", func() bool {
		var errA, errB error
		sa, errA = readSnap(pathA)
		sb, errB = readSnap(pathB)
		return errA == nil && errB == nil && reflect.DeepEqual(sa, sb)
	})
	if removed := e2eMetric(t, a.url, "kvrouter_vllm_blocks_removed_total"); removed == 0 {
		t.Fatal("no block was removed: the engines' caches never filled")
	}
	a.stop()
	b.stop()
	sa, errA := readSnap(pathA)
	sb, errB := readSnap(pathB)
	if errA != nil || errB != nil {
		t.Fatal(errA, errB)
	}
	if !reflect.DeepEqual(sa, sb) {
		t.Fatalf("shutdown snapshots differ: A %d entries, B %d", sa[0].Entries(), sb[0].Entries())
	}
	t.Logf("%d requests; index of %d entries over %d engines identical; B's first snapshot held %d entries",
		sent.Load(), sa[0].Entries(), len(sa[0].Engines), first[0].Entries())
}
