package routing

import (
	"fmt"
	"testing"
)

// TestSessionAgreesAcrossRouters: two Router instances built independently,
// their replicas added in different orders and with different histories
// (other traffic routed through one of them, so their loads and index
// predictions differ), pin every session key to the same engine; marking
// an engine unhealthy on both, or removing it, moves only the sessions it
// held, to the same new engine on both.
func TestSessionAgreesAcrossRouters(t *testing.T) {
	for _, kind := range indexKinds {
		t.Run(kind, func(t *testing.T) {
			a := newFleet(t, kind, "session", 1, "e0", "e1", "e2", "e3", "e4")
			b := newFleet(t, kind, "session", 2, "e4", "e2", "e0", "e3", "e1")
			for i := range 50 { // private history of b: leases left open
				if _, _, err := b.r.Route(&Request{Tokens: tokens(i, 200)}); err != nil {
					t.Fatal(err)
				}
			}
			pick := func(f *fleet, key string) string {
				t.Helper()
				d, l, err := f.r.Route(&Request{Tokens: tokens(7, 100), SessionKey: key})
				if err != nil {
					t.Fatal(err)
				}
				l.Release()
				return d.Name
			}
			const n = 1000
			before := map[string]string{}
			per := map[string]int{}
			for i := range n {
				key := fmt.Sprint("session-", i)
				pa, pb := pick(a, key), pick(b, key)
				if pa != pb {
					t.Fatalf("session %s: router a picks %s, router b %s", key, pa, pb)
				}
				before[key] = pa
				per[pa]++
			}
			for e, c := range per {
				if c < n/5/2 {
					t.Fatalf("engine %s holds %d of %d sessions: %v", e, c, n, per)
				}
			}
			for _, change := range []struct {
				name string
				do   func(f *fleet)
			}{
				{"unhealthy", func(f *fleet) { f.r.SetHealthy("e2", false) }},
				{"removed", func(f *fleet) { f.r.SetHealthy("e2", true); f.r.RemoveReplica("e2") }},
			} {
				change.do(a)
				change.do(b)
				moved := 0
				for key, was := range before {
					pa, pb := pick(a, key), pick(b, key)
					switch {
					case pa != pb:
						t.Fatalf("%s: session %s: a picks %s, b %s", change.name, key, pa, pb)
					case was == "e2" && pa == "e2":
						t.Fatalf("%s: session %s still on e2", change.name, key)
					case was != "e2" && pa != was:
						t.Fatalf("%s: session %s moved from %s to %s, only e2's may move", change.name, key, was, pa)
					case was == "e2":
						moved++
					}
				}
				if moved != per["e2"] {
					t.Fatalf("%s: %d sessions moved, e2 held %d", change.name, moved, per["e2"])
				}
			}
		})
	}
}
