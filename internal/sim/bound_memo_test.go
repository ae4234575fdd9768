package sim

import (
	"reflect"
	"testing"

	"kvrouter/internal/workload"
)

// TestBoundMemo: the Mooncake trace's first 300 records at speeds 1 and
// 3 (every arrival time differs) give one computed bound, equal to
// PooledBound's; other output lengths, a larger fleet or a scale-up to a
// larger peak compute anew.
func TestBoundMemo(t *testing.T) {
	build := func(speed float64, maxOut int) *workload.Workload {
		w, err := workload.Mooncake(trace(t), workload.MooncakeOptions{Limit: 300, Speed: speed, MaxOutputTokens: maxOut})
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	slow, fast := build(1, 0), build(3, 0)
	if slow.Requests[10].At == fast.Requests[10].At {
		t.Fatal("speed did not change arrival times")
	}
	cfg := Config{Replicas: 2}
	want, err := PooledBound(t.Context(), cfg, fast)
	if err != nil {
		t.Fatal(err)
	}
	var m BoundMemo
	for i, w := range []*workload.Workload{slow, fast, slow} {
		b, err := m.PooledBound(t.Context(), cfg, w)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(b, want) || m.computed != 1 {
			t.Fatalf("call %d: %d computed, bound equal to PooledBound's: %v", i, m.computed, reflect.DeepEqual(b, want))
		}
	}
	for i, c := range []struct {
		cfg Config
		w   *workload.Workload
	}{
		{cfg, build(1, 64)},
		{Config{Replicas: 3}, slow},
		{Config{Replicas: 3, Scale: []Scale{{At: 1, Delta: 1}}}, slow},
	} {
		b, err := m.PooledBound(t.Context(), c.cfg, c.w)
		if err != nil {
			t.Fatal(err)
		}
		direct, _ := PooledBound(t.Context(), c.cfg, c.w)
		if m.computed != 2+i || !reflect.DeepEqual(b, direct) {
			t.Errorf("change %d: %d computed (want %d), equal to PooledBound's: %v", i, m.computed, 2+i, reflect.DeepEqual(b, direct))
		}
	}
}
