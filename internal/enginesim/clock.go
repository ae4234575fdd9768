package enginesim

import "time"

// Clock is the Server's time source: the wall clock by default, anything
// else in tests. The Core itself never reads a clock; the fleet simulator
// drives it on its own virtual clock.
type Clock interface {
	Now() time.Time
	// After delivers the time on the channel once d has passed.
	After(d time.Duration) <-chan time.Time
}

// wallClock is the real clock.
type wallClock struct{}

func (wallClock) Now() time.Time                         { return time.Now() }
func (wallClock) After(d time.Duration) <-chan time.Time { return time.After(d) }
