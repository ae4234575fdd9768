package group

import "testing"

// TestTrustWithoutIndex: a router that cannot switch index trust (nil
// IndexTruster) keeps every engine trusted however many answers miss.
func TestTrustWithoutIndex(t *testing.T) {
	var tr Trust
	for i := range 2 * trustMisses {
		if ch, _ := tr.Observe(nil, "e0", 368, 0); ch != TrustKept {
			t.Fatalf("miss %d: change %v without a truster", i, ch)
		}
	}
}
