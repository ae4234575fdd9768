package bodybudget

import (
	"sync"
	"testing"

	"kvrouter/internal/testwait"
)

// TestTakeGive: takes succeed up to the bound and not past it; a refused
// take reserves nothing; gives free room again; no bound takes anything.
func TestTakeGive(t *testing.T) {
	b := New(100)
	if !b.Take(60) || !b.Take(40) {
		t.Fatal("takes within the bound refused")
	}
	if b.Take(1) {
		t.Fatal("a take past the bound succeeded")
	}
	if h := b.Held(); h != 100 {
		t.Fatalf("held %d after a refused take, want 100", h)
	}
	b.Give(40)
	if !b.Take(40) || b.Held() != 100 {
		t.Fatalf("after a give: held %d, want the freed room taken again (100)", b.Held())
	}
	b.Give(100)
	if h := b.Held(); h != 0 {
		t.Fatalf("held %d after everything was given back", h)
	}
	var none Budget
	if !none.Take(1<<40) || none.Max() != 0 {
		t.Fatal("the zero Budget bounds takes")
	}
}

// TestConcurrentNeverPastBound: many goroutines taking and giving never
// hold more than the bound together, and end at zero.
func TestConcurrentNeverPastBound(t *testing.T) {
	b := &Budget{max: 1000}
	var wg sync.WaitGroup
	var mu sync.Mutex
	over := int64(0)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 2000 {
				if b.Take(300) {
					if h := b.Held(); h > 1000 {
						mu.Lock()
						over = max(over, h)
						mu.Unlock()
					}
					b.Give(300)
				}
			}
		}()
	}
	wg.Wait()
	if over != 0 || b.Held() != 0 {
		t.Fatalf("held up to %d (bound 1000), %d at the end", over, b.Held())
	}
}

// TestReleaseAfterBurst: falling from a peak of at least ReleaseAbove to
// an eighth of it calls release once; a second burst within
// ReleaseEvery does not; small peaks never do.
func TestReleaseAfterBurst(t *testing.T) {
	calls := make(chan struct{}, 4)
	b := &Budget{release: func() { calls <- struct{}{} }}
	b.Take(ReleaseAbove / 2)
	b.Give(ReleaseAbove / 2)
	if len(calls) != 0 {
		t.Fatal("released after a peak under ReleaseAbove")
	}
	b.Take(ReleaseAbove)
	b.Give(ReleaseAbove / 2)
	if len(calls) != 0 {
		t.Fatal("released while more than an eighth of the peak is held")
	}
	b.Give(ReleaseAbove / 2)
	testwait.For(t, "release after the burst", func() bool { return len(calls) == 1 })
	testwait.For(t, "the release to finish", func() bool { return !b.releasing.Load() })
	b.Take(ReleaseAbove)
	b.Give(ReleaseAbove)
	if len(calls) != 1 {
		t.Fatalf("%d releases, want 1: a second burst within ReleaseEvery released again", len(calls))
	}
}
