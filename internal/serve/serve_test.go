package serve

import (
	"errors"
	"strings"
	"testing"
)

// TestRecovered: the wrapper every serve/demo/engine-sim goroutine runs
// under turns a panic into an error naming the goroutine and passes
// results through.
func TestRecovered(t *testing.T) {
	err := recovered("fleet", func() error { panic("boom") })()
	if err == nil || !strings.HasPrefix(err.Error(), "fleet panicked: boom\n") || !strings.Contains(err.Error(), "goroutine") {
		t.Errorf("panic: got %v", err)
	}
	want := errors.New("plain")
	if err := recovered("x", func() error { return want })(); err != want {
		t.Errorf("error: got %v, want %v", err, want)
	}
	if err := recovered("x", func() error { return nil })(); err != nil {
		t.Errorf("nil: got %v", err)
	}
}
