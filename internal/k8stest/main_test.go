package k8stest

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no goroutine outlives the tests: informers,
// watches and process waiters all stop.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
