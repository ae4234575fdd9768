package routing

import (
	"testing"
	"time"
)

// TestLeasePredictedTTFT: a lease predicts the time to its first token as
// the prefill queued on its replica, its own uncached tokens included, at
// the replica's prefill rate; the fleet's stall deadline is a multiple of
// it.
func TestLeasePredictedTTFT(t *testing.T) {
	r, err := New(Config{Policy: "least_load", PrefillRate: 20000}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.AddReplica("a")
	_, first, err := r.Route(&Request{Tokens: tokens(1, 100_000)})
	if err != nil {
		t.Fatal(err)
	}
	if got := first.PredictedTTFT(); got != 5*time.Second {
		t.Fatalf("100K tokens at 20K/s: PredictedTTFT %v, want 5s", got)
	}
	_, second, _ := r.Route(&Request{Tokens: tokens(2, 2_000)})
	if got := second.PredictedTTFT(); got != 5100*time.Millisecond {
		t.Fatalf("behind 100K queued tokens: PredictedTTFT %v, want 5.1s", got)
	}
	first.FirstToken()
	_, third, _ := r.Route(&Request{Tokens: tokens(3, 2_000)})
	if got := third.PredictedTTFT(); got != 200*time.Millisecond {
		t.Fatalf("behind 2K queued tokens: PredictedTTFT %v, want 0.2s", got)
	}
	for _, l := range []*Lease{first, second, third} {
		l.Release()
	}
}
