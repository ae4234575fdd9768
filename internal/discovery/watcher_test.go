package discovery

import (
	"testing"
	"time"
)

// TestRetryDelayBound: the retry delay starts at retryFirst, never exceeds
// retryCap stretched by retryJitter (0.3 s: the bound discovery's catch-up
// after an outage rests on), and starts again after retryReset without a
// failure.
func TestRetryDelayBound(t *testing.T) {
	var d retryDelay
	now := time.Unix(0, 0)
	bound := time.Duration(float64(retryCap) * (1 + retryJitter))
	var largest time.Duration
	for i := range 1000 {
		got := d.next(now)
		if i == 0 && (got < retryFirst || got > time.Duration(float64(retryFirst)*(1+retryJitter))) {
			t.Fatalf("first delay %v, want %v..%v", got, retryFirst, time.Duration(float64(retryFirst)*(1+retryJitter)))
		}
		if got > bound {
			t.Fatalf("delay %d: %v > %v", i, got, bound)
		}
		largest = max(largest, got)
		now = now.Add(got)
	}
	if largest < retryCap || bound > 300*time.Millisecond {
		t.Fatalf("largest delay %v, bound %v: want the cap reached and the bound <= 0.3 s", largest, bound)
	}
	if got := d.next(now.Add(retryReset + time.Second)); got > time.Duration(float64(retryFirst)*(1+retryJitter)) {
		t.Fatalf("after %v without failures: delay %v, want it back at %v", retryReset, got, retryFirst)
	}
}
