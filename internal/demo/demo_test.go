package demo

import (
	"strings"
	"testing"
	"time"

	"kvrouter/internal/bench/report"
)

// TestDemoWarnsWhenBehind checks that the demo names each run whose replay
// sent more than one request in twenty late, or whose engines' steps took
// more than a quarter longer than modelled, and says nothing when every run
// kept pace.
func TestDemoWarnsWhenBehind(t *testing.T) {
	run := func(name string, n, late int, lag time.Duration) demoPace {
		return demoPace{run: &report.Run{Policy: name, Samples: make([]report.Sample, n), LateSends: late, MaxLateness: 1234 * time.Millisecond},
			lag: lag, modelled: 10 * time.Second}
	}
	var b strings.Builder
	warnBehind(&b, []demoPace{run("round_robin", 100, 5, 2500*time.Millisecond), run("kv", 100, 0, 0)}, 10)
	if b.Len() != 0 {
		t.Fatalf("runs that kept pace (5 of 100 late, engines 25%% slow at most) drew a warning: %q", b.String())
	}
	warnBehind(&b, []demoPace{run("round_robin", 100, 6, 0), run("kv", 100, 40, 0), run("least_load", 100, 0, 3*time.Second)}, 10)
	for _, want := range []string{
		"round_robin: this machine could not keep pace with the trace: 6 of 100 requests were sent more than 50ms late (up to 1.234s)",
		"kv: this machine could not keep pace with the trace: 40 of 100",
		"least_load: this machine could not keep pace with the trace: the engines' steps took 30% longer than their timing model (3s beyond 10s)",
		"the replay fell behind", "--speed 5",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("warning lacks %q:\n%s", want, b.String())
		}
	}
}
