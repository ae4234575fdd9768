package enginesim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"kvrouter/internal/testwait"
)

// TestSoak runs 200 concurrent streaming clients against one engine for
// KVROUTER_SOAK (default 3s; the full soak is 2 minutes:
//
//	KVROUTER_SOAK=2m go test -run TestSoak -timeout 10m ./internal/enginesim/
//
// ) and checks that goroutines return to their baseline, that every request
// completed, and that the heap does not grow over the run.
func TestSoak(t *testing.T) {
	dur := 3 * time.Second
	if v := os.Getenv("KVROUTER_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("KVROUTER_SOAK: %v", err)
		}
		dur = d
	}
	if testing.Short() {
		dur = time.Second
	}
	const clients = 200
	s := startServer(t, Config{Core: CoreConfig{NumGPUBlocks: 4096, MaxModelLen: 8192}})
	tr := &http.Transport{MaxIdleConnsPerHost: clients}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}

	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	// Baseline after the server's goroutines are up: one request, then no
	// idle connections.
	if r, b := post(t, s.url+"/v1/completions", map[string]any{"prompt": "warm-up", "max_tokens": 1}); r.StatusCode != 200 {
		t.Fatalf("warm-up: %d %s", r.StatusCode, b)
	}
	http.DefaultClient.CloseIdleConnections()
	// The closed connections' goroutines end soon; a baseline taken while
	// one lingers is only higher, which the final check tolerates.
	time.Sleep(100 * time.Millisecond)
	baseG := runtime.NumGoroutine()

	var done, failed atomic.Int64
	stop := time.Now().Add(dur)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for i := 0; time.Now().Before(stop); i++ {
				// 16 shared system prompts, unique tails: hits and evictions.
				prompt := strings.Repeat(fmt.Sprintf("system prompt %02d ", c%16), 20) + fmt.Sprintf("client %d turn %d", c, i)
				b, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 16, "stream": true,
					"stream_options": map[string]any{"include_usage": true}})
				resp, err := hc.Post(s.url+"/v1/completions", "application/json", bytes.NewReader(b))
				if err != nil {
					failed.Add(1)
					continue
				}
				sc := bufio.NewScanner(resp.Body)
				last := ""
				for sc.Scan() {
					if l := sc.Text(); l != "" {
						last = l
					}
				}
				resp.Body.Close()
				if last != "data: [DONE]" {
					failed.Add(1)
					continue
				}
				done.Add(1)
			}
		})
	}
	// Heap samples over the run: after warm-up, then near the end.
	time.Sleep(dur / 4)
	early := heap()
	time.Sleep(dur / 2)
	late := heap()
	wg.Wait()
	tr.CloseIdleConnections()

	if failed.Load() > 0 || done.Load() < clients {
		t.Fatalf("%d requests done, %d failed", done.Load(), failed.Load())
	}
	testwait.For(t, "engine idle", func() bool { st := s.state.Load(); return st.running == 0 && st.waiting == 0 })
	for i := 0; runtime.NumGoroutine() > baseG+2; i++ {
		if i == 1000 {
			var sb strings.Builder
			pprof.Lookup("goroutine").WriteTo(&sb, 1)
			t.Fatalf("goroutines: %d, baseline %d:\n%s", runtime.NumGoroutine(), baseG, sb.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if late > early+early/2+16<<20 {
		t.Fatalf("heap grew during the soak: %d MiB -> %d MiB", early>>20, late>>20)
	}
	t.Logf("soak %v: %d streams completed, heap %d -> %d MiB, goroutines %d", dur, done.Load(), early>>20, late>>20, runtime.NumGoroutine())
}
