package vllm

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when any goroutine outlives them: the
// subscriber's Run must return only after every goroutine it started
// (readers, accept loops, replay connections, the apply loop) has exited.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
