package group

import "testing"

// TestBackendSetStripesSurvivesRebuild: the place SetStripes gives a
// group's router holds after the index and router are rebuilt for a new
// block size (a rebuild copies the group's routing config), and a bad
// place is refused without changing it.
func TestBackendSetStripesSurvivesRebuild(t *testing.T) {
	b, err := NewBackend(BackendConfig{Model: "m", Replicas: []string{"a", "b"}, Exact: true}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.SetStripes(3, 2); err != nil {
		t.Fatal(err)
	}
	if err := b.SetStripes(2, 2); err == nil {
		t.Error("SetStripes(2, 2) accepted")
	}
	old := b.cur.Load()
	b.setBlockSize("a", 32, "test")
	g := b.cur.Load()
	if g == old || g.blockSize != 32 {
		t.Fatalf("no rebuild: block size %d", g.blockSize)
	}
	if n, i := g.router.Stripes(); n != 3 || i != 2 {
		t.Errorf("after the rebuild the router's place is %d, %d, want 3, 2", n, i)
	}
}
