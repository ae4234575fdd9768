package kvevents

import "testing"

func TestSeqTrackerLive(t *testing.T) {
	type step struct {
		live   uint64
		want   liveStep
		accept []uint64 // seqs handed on (replayed ones first, then the live one)
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"in order from 0", []step{
			{0, liveStep{fresh: true}, []uint64{0}},
			{1, liveStep{}, []uint64{1}},
			{2, liveStep{}, []uint64{2}},
		}},
		{"first message mid-stream is a catch-up, not a gap", []step{
			{5, liveStep{fresh: true, missing: true, missFrom: 0}, []uint64{5}},
			{6, liveStep{}, []uint64{6}},
		}},
		{"gap then duplicates after replay", []step{
			{0, liveStep{fresh: true}, []uint64{0}},
			{3, liveStep{missing: true, missFrom: 1}, []uint64{1, 2, 3, 4, 5}},
			{4, liveStep{dup: true}, nil},
			{5, liveStep{dup: true}, nil},
			{6, liveStep{}, []uint64{6}},
		}},
		{"restart to 0", []step{
			{0, liveStep{fresh: true}, []uint64{0}},
			{1, liveStep{}, []uint64{1}},
			{0, liveStep{restart: true, fresh: true}, []uint64{0}},
			{1, liveStep{}, []uint64{1}},
		}},
		{"restart whose first batches were lost", []step{
			{7, liveStep{fresh: true, missing: true}, []uint64{7}},
			{3, liveStep{restart: true, fresh: true, missing: true, missFrom: 0}, []uint64{3}},
			{4, liveStep{}, []uint64{4}},
		}},
		{"same seq twice live is a restart", []step{
			{4, liveStep{fresh: true, missing: true}, []uint64{4}},
			{4, liveStep{restart: true, fresh: true, missing: true}, []uint64{4}},
		}},
		{"replayed seqs beyond live do not count for restarts", []step{
			{0, liveStep{fresh: true}, []uint64{0}},
			{2, liveStep{missing: true, missFrom: 1}, []uint64{1, 2, 3, 4}},
			{3, liveStep{dup: true}, nil},
			{4, liveStep{dup: true}, nil},
			{2, liveStep{restart: true, fresh: true, missing: true}, []uint64{2}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var tr seqTracker
			for i, s := range tt.steps {
				got := tr.live(s.live)
				if got != s.want {
					t.Fatalf("step %d live(%d) = %+v, want %+v", i, s.live, got, s.want)
				}
				for _, a := range s.accept {
					if isNew, hole := tr.accept(a); !isNew || hole {
						t.Fatalf("step %d accept(%d) = %v, %v, want new without hole", i, a, isNew, hole)
					}
				}
			}
		})
	}
}

func TestSeqTrackerAccept(t *testing.T) {
	var tr seqTracker
	check := func(seq uint64, wantNew, wantHole bool) {
		t.Helper()
		if isNew, hole := tr.accept(seq); isNew != wantNew || hole != wantHole {
			t.Fatalf("accept(%d) = %v, %v; want %v, %v", seq, isNew, hole, wantNew, wantHole)
		}
	}
	if tr.next() != 0 {
		t.Fatalf("next on empty tracker = %d", tr.next())
	}
	check(3, true, false) // fresh epoch: a missing prefix is no hole
	check(4, true, false)
	check(4, false, false)
	check(2, false, false)
	check(7, true, true) // 5 and 6 never applied
	if tr.next() != 8 {
		t.Fatalf("next = %d, want 8", tr.next())
	}
}
