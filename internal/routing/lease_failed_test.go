package routing

import (
	"testing"

	"kvrouter/internal/kvindex"
)

// TestLeaseFailedDropsPrediction: a request the engine answered with an
// error stops looking cached on its replica at once (it did for the
// prediction TTL before); its load stays until Release; a second Failed
// and a Failed on the approximate index (nothing predicted) are harmless.
func TestLeaseFailedDropsPrediction(t *testing.T) {
	for _, kind := range indexKinds {
		t.Run(kind, func(t *testing.T) {
			f := newFleet(t, kind, "kv", 1, "a", "b")
			prompt := tokens(1, 40*bs)
			d, lease := f.route(prompt, nil)
			keys := kvindex.Keys(nil, prompt, bs, kvindex.Extras{Root: f.ix.(keySpace).Root()})
			chosen := func() kvindex.Match {
				id, _ := f.ix.(interface {
					ReplicaID(string) (kvindex.ReplicaID, bool)
				}).ReplicaID(d.Name)
				return f.ix.Lookup(keys, nil)[id]
			}
			before := chosen()
			lease.Failed()
			after := chosen()
			switch kind {
			case "exact":
				if before.Predicted != 40 || after.Predicted != 0 {
					t.Errorf("predicted blocks %d before Failed, %d after; want 40, 0", before.Predicted, after.Predicted)
				}
				if s := f.ix.(*kvindex.Exact).Stats(); s.Cancelled != 40 {
					t.Errorf("Cancelled = %d, want 40", s.Cancelled)
				}
			case "approx": // the approximate index learns from decisions, not predictions
				if after != before {
					t.Errorf("approx match changed: %+v -> %+v", before, after)
				}
			}
			if l, _ := f.r.Load(d.Name); l.InFlight != 1 {
				t.Errorf("in flight %d after Failed, want 1 until Release", l.InFlight)
			}
			lease.Failed()
			lease.Release()
			if l, _ := f.r.Load(d.Name); l.InFlight != 0 {
				t.Errorf("in flight %d after Release", l.InFlight)
			}
		})
	}
}
