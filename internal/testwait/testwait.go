// Package testwait lets a test wait for a condition instead of for time:
// it polls until the condition holds or a deadline passes, then fails the
// test with a message naming what it waited for and what it last saw.
package testwait

import (
	"fmt"
	"testing"
	"time"
)

// Default is the deadline of For: long enough for a loaded 2-core
// machine, where a condition that normally holds within milliseconds may
// take seconds.
const Default = 30 * time.Second

// interval is the time between two polls.
const interval = 5 * time.Millisecond

// For polls cond every few milliseconds until it returns true, and fails
// t (t.Fatalf, so it must be called from the test's goroutine) if it has
// not within Default. what names the condition in the failure message.
func For(t testing.TB, what string, cond func() bool) {
	t.Helper()
	Within(t, Default, what, cond)
}

// Within is For with deadline d.
func Within(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	Seen(t, d, what, func() (bool, any) { return cond(), nil })
}

// Seen is Within for a condition that also reports what it saw; the
// failure message carries the last value seen (omitted when nil).
func Seen(t testing.TB, d time.Duration, what string, cond func() (bool, any)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, seen := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			msg := fmt.Sprintf("timed out after %v waiting for %s", d, what)
			if seen != nil {
				msg += fmt.Sprintf("; last seen %v", seen)
			}
			t.Fatal(msg)
			return
		}
		time.Sleep(interval)
	}
}
