package kvindex

import "testing"

// routed is RoutedMatch after a Lookup, as routing.Router calls it.
func routed(x *Exact, name string, p []uint32) Prediction {
	id, _ := x.ReplicaID(name)
	keys := Keys(nil, p, 4, Extras{Root: x.Root()})
	m := x.Lookup(keys, nil)[id]
	return x.RoutedMatch(id, keys, m)
}

// A request the engine rejected: Cancel drops its predicted blocks at
// once, so the prompt no longer looks cached on the replica (it did until
// the prediction TTL before), and a second Cancel changes nothing.
func TestCancelDropsPrediction(t *testing.T) {
	x := testExact(newClock(), nil)
	x.AddReplica("a")
	x.AddReplica("b")
	p := seq(0, 64) // 16 blocks
	x.Apply("a", batch(0, storedEv(nil, []uint64{1, 2}, p[:8], "")))
	pred := routed(x, "a", p) // 2 held, 14 predicted
	if m := lookupOf(x, "a", p, Extras{}); m != (Match{GPU: 2, Predicted: 14}) {
		t.Fatalf("before cancel: %+v", m)
	}
	if n := x.Cancel(pred); n != 14 {
		t.Fatalf("Cancel dropped %d, want 14", n)
	}
	if m := lookupOf(x, "a", p, Extras{}); m != (Match{GPU: 2}) {
		t.Errorf("after cancel: %+v, want only the 2 held blocks", m)
	}
	predictionStats(t, x, 14, 0, 0, 0)
	if s := x.Stats(); s.Cancelled != 14 {
		t.Errorf("Cancelled = %d, want 14", s.Cancelled)
	}
	if n := x.Cancel(pred); n != 0 {
		t.Errorf("second Cancel dropped %d", n)
	}
	if n := x.Cancel(Prediction{}); n != 0 {
		t.Errorf("zero Prediction dropped %d", n)
	}
}

// Cancelling a request that shares a prefix with one routed before it to
// the same replica keeps the shared blocks (the earlier request predicted
// them too) and drops only its own.
func TestCancelKeepsSharedPrefix(t *testing.T) {
	x := testExact(newClock(), nil)
	x.AddReplica("a")
	p1 := seq(0, 32)                           // blocks A..H
	p2 := append(seq(0, 16), seq(1000, 48)...) // A..D, then 12 blocks of its own
	routed(x, "a", p1)
	pred2 := routed(x, "a", p2) // takes A..D over from p1's run
	if n := x.Cancel(pred2); n != 12 {
		t.Fatalf("Cancel dropped %d, want p2's own 12 blocks", n)
	}
	if m := lookupOf(x, "a", p1, Extras{}); m != (Match{Predicted: 8}) {
		t.Errorf("p1 after p2's cancel: %+v, want all 8 still predicted", m)
	}
	if m := lookupOf(x, "a", p2, Extras{}); m != (Match{Predicted: 4}) {
		t.Errorf("p2 after its cancel: %+v, want only the shared 4", m)
	}
	predictionStats(t, x, 20, 0, 0, 8)
	// The engine stores p1: all of it confirmed, the shared part too.
	x.Apply("a", batch(0, storedEv(nil, []uint64{1, 2, 3, 4, 5, 6, 7, 8}, p1, "")))
	predictionStats(t, x, 20, 8, 0, 0)
}

// A Prediction whose run was confirmed, and whose slot another request
// then took, cancels nothing: the later request's blocks stay.
func TestCancelStalePrediction(t *testing.T) {
	x := testExact(newClock(), nil)
	x.AddReplica("a")
	p := seq(0, 16)
	old := routed(x, "a", p)
	x.Apply("a", batch(0, storedEv(nil, []uint64{1, 2, 3, 4}, p, ""))) // confirmed: the run is dropped
	q := seq(500, 16)
	fresh := routed(x, "a", q) // reuses the slot
	if fresh.run != old.run {
		t.Fatalf("slot not reused (%d, %d): the test needs it", fresh.run, old.run)
	}
	if n := x.Cancel(old); n != 0 {
		t.Fatalf("stale Cancel dropped %d", n)
	}
	if m := lookupOf(x, "a", q, Extras{}); m != (Match{Predicted: 4}) {
		t.Errorf("the later request's prediction: %+v", m)
	}
}

// Cancel after the prediction TTL, or with prediction off, is a no-op.
func TestCancelExpiredOrOff(t *testing.T) {
	c := newClock()
	x := testExact(c, nil)
	x.AddReplica("a")
	pred := routed(x, "a", seq(0, 16))
	c.Add(x.cfg.PredictTTL + 1)
	x.Stats() // expires
	if n := x.Cancel(pred); n != 0 {
		t.Errorf("Cancel of an expired prediction dropped %d", n)
	}
	off := testExact(newClock(), func(cfg *Config) { cfg.PredictTTL = -1 })
	off.AddReplica("a")
	if p := routed(off, "a", seq(0, 16)); p != (Prediction{}) || off.Cancel(p) != 0 {
		t.Errorf("prediction off: %+v", p)
	}
}
