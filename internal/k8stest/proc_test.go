package k8stest

import (
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"
)

// A child outlives the Go threads that goroutines end by returning while
// locked to them (as NetNS.Listen's does): Pdeathsig is tied to the
// forking thread, which startProc keeps alive for the child's lifetime.
func TestProcSurvivesEndedThreads(t *testing.T) {
	p, err := startProc("sleep", filepath.Join(t.TempDir(), "log"), "/bin/sleep", "30")
	if err != nil {
		t.Fatal(err)
	}
	defer p.stop(time.Second)
	for range 20 {
		var wg sync.WaitGroup
		for range 4 * runtime.GOMAXPROCS(0) {
			wg.Go(func() { runtime.LockOSThread() }) // returns locked: the thread ends
		}
		wg.Wait()
		runtime.Gosched()
	}
	time.Sleep(100 * time.Millisecond) // absence: a parent-death signal, if sent, has arrived by now
	if p.exited() {
		t.Fatalf("the child died with a thread of the test binary: %v", p.err)
	}
}
