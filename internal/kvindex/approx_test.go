package kvindex

import (
	"testing"
	"time"
)

func testApprox(c *clock, mod func(*Config)) *Approx {
	cfg := Config{Model: "m", BlockSize: 4, Now: c.Now, ApproxTTL: 10 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	a, err := NewApprox(cfg, nil, nil)
	if err != nil {
		panic(err)
	}
	return a
}

func TestApproxTTL(t *testing.T) {
	c := newClock()
	a := testApprox(c, nil)
	r := a.AddReplica("r")
	a.Routed(r, Keys(nil, abcd, 4, Extras{Root: a.Root()}))
	if m := lookupOf(a, "r", abcd, Extras{}); m.GPU != 4 {
		t.Fatalf("routed blocks: %+v", m)
	}
	c.Add(11 * time.Second)
	if m := lookupOf(a, "r", abcd, Extras{}); m.Blocks() != 0 {
		t.Fatalf("expired blocks still match: %+v", m)
	}
	a.Routed(r, Keys(nil, abcd[:4], 4, Extras{Root: a.Root()}))
	if s := a.Stats(); s.Entries != 1 || s.Evicted != 4 {
		t.Fatalf("stats %+v", s)
	}
}

func TestApproxCapacityLRU(t *testing.T) {
	c := newClock()
	a := testApprox(c, nil)
	a.SetCapacity("r", 3)
	r, _ := a.ReplicaID("r")
	a.Routed(r, Keys(nil, abcd, 4, Extras{Root: a.Root()}))
	// Capacity 3: the deepest block goes first, the prefix stays.
	if m := lookupOf(a, "r", abcd, Extras{}); m.GPU != 3 {
		t.Fatalf("capacity 3: %+v", m)
	}
	other := seq(500, 8)
	a.Routed(r, Keys(nil, other, 4, Extras{Root: a.Root()}))
	if m := lookupOf(a, "r", abcd, Extras{}); m.GPU != 1 {
		t.Fatalf("after 2 more blocks: %+v, want 1 left", m)
	}
	if got := a.ReplicaBlocks(r); got != 3 {
		t.Fatalf("ReplicaBlocks = %d", got)
	}
	if !a.RemoveReplica("r") || a.Stats().Entries != 0 {
		t.Fatal("RemoveReplica must drop entries")
	}
}
