package proxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"kvrouter/internal/admission"
	"kvrouter/internal/request"
)

// lastEventEndRef is the definition of lastEventEnd: the end of the last
// "\n\n" or "\r\n\r\n", whichever ends later.
func lastEventEndRef(b []byte) int {
	i := bytes.LastIndex(b, []byte("\n\n"))
	j := bytes.LastIndex(b, []byte("\r\n\r\n"))
	if j >= 0 && j+4 > i+2 {
		return j + 4
	}
	if i >= 0 {
		return i + 2
	}
	return 0
}

func TestLastEventEnd(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
	}{
		{"", 0},
		{"\n", 0},
		{"\n\n", 2},
		{"data: x\n", 0},
		{"data: x\n\n", 9},
		{"data: x\n\ndata: y\n", 9},
		{"data: x\n\ndata: y\n\n", 18},
		{"data: x\r\n\r\n", 11},
		{"data: x\r\n\r\ndata: y\r\n", 11},
		{"data: x\r\n\n", 10},
		{"data: x\n\r\n", 0},
		{"a\nb\nc\n", 0},
		{"a\n\nb\nc\nd", 3},
		{"\r\n\r", 0},
	} {
		if got := lastEventEnd([]byte(tc.in)); got != tc.want {
			t.Errorf("lastEventEnd(%q) = %d, want %d", tc.in, got, tc.want)
		}
		if ref := lastEventEndRef([]byte(tc.in)); ref != tc.want {
			t.Errorf("reference(%q) = %d, want %d", tc.in, ref, tc.want)
		}
	}
}

// FuzzLastEventEnd checks the newline walk against the definition on
// arbitrary engine bytes.
func FuzzLastEventEnd(f *testing.F) {
	f.Add([]byte(benchChunk))
	f.Add([]byte("data: {\"a\":1}\r\n\r\ndata: [DONE]\r\n"))
	f.Add([]byte(": ping\n\nevent: x\ndata: y\n\n\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := lastEventEnd(b), lastEventEndRef(b); got != want {
			t.Fatalf("lastEventEnd(%q) = %d, want %d", b, got, want)
		}
	})
}

// TestWatchdog: the first-byte clock runs until the first progress, then
// the idle clock counts from the latest progress (re-armed by the timer,
// not per chunk), and stop ends it.
func TestWatchdog(t *testing.T) {
	const firstByte, idle = 500 * time.Millisecond, 100 * time.Millisecond
	run := func(t *testing.T, steps []time.Duration) (time.Duration, error) {
		var cause error
		var at time.Duration
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			ctx, cancel := context.WithCancelCause(context.Background())
			wd := newWatchdog(func(err error) { cancel(err); cause, at = err, time.Since(start) }, firstByte, idle)
			defer wd.stop()
			for _, d := range steps {
				time.Sleep(d) // synctest's virtual clock: the delay under test, exact
				wd.progress(time.Now())
			}
			<-ctx.Done()
		})
		return at, cause
	}
	for _, tc := range []struct {
		name  string
		steps []time.Duration // sleep, then progress
		want  error
		at    time.Duration
	}{
		{"no byte", nil, errFirstByteTimeout, firstByte},
		{"silent after first", []time.Duration{300 * time.Millisecond}, errIdleTimeout, 400 * time.Millisecond},
		{"chunks then silence", []time.Duration{10 * time.Millisecond, 40 * time.Millisecond, 40 * time.Millisecond, 99 * time.Millisecond}, errIdleTimeout, 289 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at, cause := run(t, tc.steps)
			if cause != tc.want || at != tc.at {
				t.Errorf("canceled with %v at %v, want %v at %v", cause, at, tc.want, tc.at)
			}
		})
	}
	t.Run("stopped", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			fired := false
			wd := newWatchdog(func(error) { fired = true }, firstByte, idle)
			wd.progress(time.Now())
			time.Sleep(50 * time.Millisecond) // virtual time (synctest)
			wd.progress(time.Now())
			wd.stop()
			time.Sleep(10 * time.Second) // virtual: far past every timeout
			if fired {
				t.Error("a stopped watchdog canceled")
			}
		})
	})
}

// pieceReader yields its bytes at most n per Read, as an engine's stream
// arrives in TCP segments.
type pieceReader struct {
	b []byte
	n int
}

func (r *pieceReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	k := copy(p[:min(len(p), r.n)], r.b)
	r.b = r.b[k:]
	return k, nil
}

// flushRecorder is a ResponseWriter that keeps what was written and, at
// each flush, what the client had received by then.
type flushRecorder struct {
	h       http.Header
	body    bytes.Buffer
	flushed []string
}

func (w *flushRecorder) Header() http.Header         { return w.h }
func (w *flushRecorder) Write(p []byte) (int, error) { return w.body.Write(p) }
func (w *flushRecorder) WriteHeader(int)             {}
func (w *flushRecorder) FlushError() error {
	w.flushed = append(w.flushed, w.body.String())
	return nil
}

// TestCopyEventsLongEvents: events longer than the relay's read buffer
// (bufPool's), arriving in pieces of any size, are relayed byte for
// byte and flushed only whole; an error event and a usage report split
// across reads are still found.
func TestCopyEventsLongEvents(t *testing.T) {
	b := bufPool.Get().(*[]byte)
	bufSize := len(*b)
	bufPool.Put(b)
	long := func(n int) string { return `data: {"choices":[{"text":"` + strings.Repeat("x", n) + `"}]}` + "\n\n" }
	usage := `data: {"choices":[],"usage":{"prompt_tokens":9000,"prompt_tokens_details":{"cached_tokens":8192},"pad":"` +
		strings.Repeat("p", 2*bufSize) + `"}}` + "\n\n"
	failure := `data: {"error":{"message":"` + strings.Repeat("e", bufSize) + `","code":500}}` + "\n\n"
	for _, tc := range []struct {
		name      string
		events    []string
		done, err bool
		cached    int
	}{
		{"small and long", []string{long(10), long(3 * bufSize), long(10), "data: [DONE]\n\n"}, true, false, -1},
		{"long usage", []string{long(bufSize), usage, "data: [DONE]\n\n"}, true, false, 8192},
		{"long error event", []string{long(10), failure, "data: [DONE]\n\n"}, true, true, -1},
		{"long last event without blank line", []string{long(10), strings.TrimSuffix(long(2*bufSize), "\n\n")}, false, false, -1},
	} {
		for _, piece := range []int{1 << 20, bufSize, 1000, 7} {
			t.Run(fmt.Sprintf("%s/piece=%d", tc.name, piece), func(t *testing.T) {
				srv := newBenchServer(t, "http://127.0.0.1:1", nil)
				r := httptest.NewRequest(http.MethodPost, "/v1/completions", nil)
				w := &flushRecorder{h: http.Header{}}
				x := &exchange{w: w, r: r, Flow: admission.Flow{Ctx: r.Context(), Start: time.Now(), Req: &request.Parsed{Model: "m"}}}
				x.hooks = newHooks(x)
				wd := newWatchdog(func(error) {}, time.Minute, time.Minute)
				defer wd.stop()
				in := strings.Join(tc.events, "")
				failed := 0
				bp := bufPool.Get().(*[]byte)
				defer bufPool.Put(bp)
				done, err := srv.copyEvents(x, wd, &pieceReader{b: []byte(in), n: piece}, *bp, func() {}, func() { failed++ })
				if err != nil || done != tc.done {
					t.Fatalf("copyEvents = %v, %v; want %v, nil", done, err, tc.done)
				}
				if got := w.body.String(); got != in {
					t.Fatalf("relayed %d bytes, want the engine's %d", len(got), len(in))
				}
				var ends []string // what the client may have at a flush: whole events
				whole := ""
				for _, e := range tc.events {
					if whole += e; strings.HasSuffix(e, "\n\n") {
						ends = append(ends, whole)
					}
				}
				for _, f := range w.flushed {
					if !slices.Contains(ends, f) {
						t.Errorf("flushed part of an event (%d bytes)", len(f))
					}
				}
				if len(w.flushed) == 0 || w.flushed[len(w.flushed)-1] != ends[len(ends)-1] {
					t.Errorf("the last whole event was not flushed")
				}
				if want := map[bool]int{true: 1}[tc.err]; failed != want || x.streamErr != tc.err {
					t.Errorf("error event: failed called %d times, streamErr %v; want %d, %v", failed, x.streamErr, want, tc.err)
				}
				if tc.cached >= 0 && (!x.hit.seen || x.hit.cached != tc.cached) {
					t.Errorf("usage: seen %v, cached %d; want %d", x.hit.seen, x.hit.cached, tc.cached)
				}
			})
		}
	}
}
