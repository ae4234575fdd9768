package group

import "testing"

func TestRankReplicaRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name   string
		engine string
		rank   int
		ok     bool
	}{
		{RankReplica("e0", 0), "e0", 0, true},
		{RankReplica("e0", 7), "e0", 7, true},
		{RankReplica("a#dpb", 3), "a#dpb", 3, true},
		{"e0", "e0", -1, false},
		{"e0#dp", "e0#dp", -1, false},
		{"e0#dp-1", "e0#dp-1", -1, false},
		{"e0#dpx", "e0#dpx", -1, false},
	} {
		engine, rank, ok := SplitRankReplica(tc.name)
		if engine != tc.engine || rank != tc.rank || ok != tc.ok {
			t.Errorf("SplitRankReplica(%q) = %q, %d, %v; want %q, %d, %v", tc.name, engine, rank, ok, tc.engine, tc.rank, tc.ok)
		}
	}
	if got := RankReplica("http://10.0.0.1:8000", 2); got != "http://10.0.0.1:8000#dp2" {
		t.Errorf("RankReplica = %q", got)
	}
}
