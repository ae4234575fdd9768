package enginesim

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks for leaked goroutines. go-zeromq/zmq4 v0.17.0's PUB socket
// never stops its writer goroutine (pubSocket.Close does not close its
// pubMWriter); one such goroutine per publisher is a library bug, ignored
// here by name only.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}
