package routing

import (
	"sync"
	"testing"
	"time"
)

// TestSetStripesLive: a router told its place while it routes (SetStripes,
// as discovery.Peers does when router Pods come and go) deals the engines
// by the new place from the next Route on. Over e0..e7 with nothing held
// and every lease released, a fresh request goes to the router's own
// stripe: engines at positions index, index+routers, ... Concurrent Routes
// and SetStripes (run with -race) never see a mix of two places: between
// (2, 0) (e0, e2, e4, e6) and (4, 1) (e1, e5), a mix would be (2, 1) or
// (4, 0), whose e3 and e7 neither place picks. Bad places are refused and
// change nothing.
func TestSetStripesLive(t *testing.T) {
	r := stripedRouters(t, 1, false, nil, -1)[0]
	pos := func(name string) int { return int(name[1] - '0') }
	seed := 0
	route := func() int { // a new prompt each time: nothing held anywhere
		seed++
		d, l, err := r.Route(&Request{Tokens: tokens(1000+seed, 2*bs), MaxTokens: 10})
		if err != nil {
			t.Error(err)
			return -1
		}
		l.Release()
		return pos(d.Name)
	}
	for _, p := range [][2]int{{2, 1}, {4, 3}, {8, 5}, {3, 2}} {
		if err := r.SetStripes(p[0], p[1]); err != nil {
			t.Fatal(err)
		}
		if n, k := r.Stripes(); n != p[0] || k != p[1] {
			t.Fatalf("Stripes() = %d, %d after SetStripes(%d, %d)", n, k, p[0], p[1])
		}
		for range 20 {
			if got := route(); got%p[0] != p[1] {
				t.Fatalf("place %v: routed to e%d, not in its stripe", p, got)
			}
		}
	}
	for _, p := range [][2]int{{2, 2}, {-1, 0}, {0, 1}, {3, -1}} {
		if err := r.SetStripes(p[0], p[1]); err == nil {
			t.Errorf("SetStripes(%d, %d) accepted", p[0], p[1])
		}
	}
	if n, k := r.Stripes(); n != 3 || k != 2 {
		t.Errorf("refused places changed the place to %d, %d", n, k)
	}

	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			p := [2][2]int{{2, 0}, {4, 1}}[i%2]
			if err := r.SetStripes(p[0], p[1]); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	deadline := time.Now().Add(300 * time.Millisecond)
	var routes int
	for ; time.Now().Before(deadline); routes++ {
		if got := route(); got == 3 || got == 7 || got < 0 {
			t.Errorf("routed to e%d: a mix of two places", got)
			break
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("%d routes during concurrent SetStripes", routes)
}
