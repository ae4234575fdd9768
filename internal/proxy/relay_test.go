package proxy

import (
	"bytes"
	"context"
	"testing"
	"testing/synctest"
	"time"
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
