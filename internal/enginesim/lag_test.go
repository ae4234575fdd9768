package enginesim

import (
	"testing"
	"time"
)

// lateClock is the wall clock with every timer firing extra late, as on a
// machine where the engine's goroutine waits for a CPU.
type lateClock struct{ extra time.Duration }

func (lateClock) Now() time.Time                           { return time.Now() }
func (c lateClock) After(d time.Duration) <-chan time.Time { return time.After(d + c.extra) }

// TestTimingLag checks that the clock time steps take beyond their
// modelled durations is counted: with every step's timer 20 ms late, the
// lag covers at least 20 ms per step, far above the fast profile's
// modelled step times.
func TestTimingLag(t *testing.T) {
	const extra = 20 * time.Millisecond
	s := startServer(t, Config{Clock: lateClock{extra}})
	for range 3 {
		if r, b := post(t, s.url+"/v1/completions", map[string]any{"prompt": "a prompt of a few words", "max_tokens": 4}); r.StatusCode != 200 {
			t.Fatalf("status %d: %s", r.StatusCode, b)
		}
	}
	lag, modelled := s.TimingLag()
	// 3 requests of at least 4 steps each (prefill with the first token,
	// then 3 decode steps), each waited for on the late clock.
	if modelled <= 0 || lag < 12*extra || lag < modelled {
		t.Fatalf("TimingLag = lag %v, modelled %v: want lag >= %v and above modelled", lag, modelled, 12*extra)
	}
}
