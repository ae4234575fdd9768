package kvevents

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when any goroutine outlives them: the
// subscriber's Run must return only after every goroutine it started
// (readers, accept loops, replay connections, the apply loop) has exited.
//
// One goroutine is exempt: zmq4 v0.17's PUB socket (used by tests as an
// in-process engine) starts pubMWriter.run in NewPub, and pubSocket.Close
// never stops it (socket.Close does not close the writer). The subscriber
// itself does not use zmq4's socket types; see zmtp.go.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}
