package testwait

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// recorder is a testing.TB that records a Fatal instead of stopping.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatal(args ...any) {
	r.failed = args[0].(string)
}

func TestForReturnsOnceTrue(t *testing.T) {
	n := 0
	rec := &recorder{TB: t}
	For(rec, "three polls", func() bool { n++; return n == 3 })
	if rec.failed != "" || n != 3 {
		t.Fatalf("polled %d times, failure %q; want 3 polls, no failure", n, rec.failed)
	}
}

func TestSeenReportsLastValue(t *testing.T) {
	rec := &recorder{TB: t}
	start := time.Now()
	n := 0
	Seen(rec, 20*time.Millisecond, "n to reach 1000", func() (bool, any) { n++; return false, n })
	if time.Since(start) < 20*time.Millisecond {
		t.Errorf("gave up after %v, before the 20 ms deadline", time.Since(start))
	}
	want := "timed out after 20ms waiting for n to reach 1000; last seen "
	if !strings.HasPrefix(rec.failed, want) || !strings.HasSuffix(rec.failed, " "+strconv.Itoa(n)) {
		t.Errorf("failure %q, want %q followed by %d", rec.failed, want, n)
	}
}
