package kvindex

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestExactExpectedEntries checks that Config.ExpectedEntries only sizes the
// key table: an index sized for 3,000 entries answers every lookup as an
// unsized one through random stores and removals, and its key table never
// grows; out-of-range values are rejected.
func TestExactExpectedEntries(t *testing.T) {
	const bs, blocks, prompts, engines = 4, 16, 40, 6
	c := newClock()
	plain := testExact(c, func(cfg *Config) { cfg.PredictTTL = -1 })
	sized := testExact(c, func(cfg *Config) { cfg.PredictTTL = -1; cfg.ExpectedEntries = 3000 })
	groups := len(sized.st.keys.g)
	if groups != 512 { // 3,000 at 10 a group: 300, rounded up to a power of two
		t.Fatalf("key table for 3,000 entries: %d groups, want 512", groups)
	}
	rng := rand.New(rand.NewPCG(5, 9))
	toks := make([][]uint32, prompts)
	keys := make([][]Key, prompts)
	for p := range toks {
		toks[p] = append(seq(0, (p%5)*bs), seq(1000*(p+1), (blocks-p%5)*bs)...)
		keys[p] = Keys(nil, toks[p], bs, Extras{Root: plain.Root()})
	}
	for step := range 2000 {
		e, p := fmt.Sprintf("e%d", rng.IntN(engines)), rng.IntN(prompts)
		var b = batch(0)
		if rng.IntN(3) > 0 {
			n := 1 + rng.IntN(blocks)
			hs := make([]uint64, n)
			for i := range hs {
				hs[i] = uint64(p*100 + i + 1)
			}
			b = batch(0, storedEv(nil, hs, toks[p][:n*bs], "GPU"))
		} else {
			b = batch(0, removedEv("GPU", uint64(p*100+1+rng.IntN(blocks))))
		}
		plain.Apply(e, b)
		sized.Apply(e, b)
		q := rng.IntN(prompts)
		want := plain.Lookup(keys[q], nil)
		got := sized.Lookup(keys[q], nil)
		if !slices.Equal(got, want) {
			t.Fatalf("step %d: sized lookup %v, plain %v", step, got, want)
		}
	}
	if ps, ss := plain.Stats(), sized.Stats(); ps.Entries != ss.Entries || ps.Keys != ss.Keys || ps.Removed != ss.Removed {
		t.Fatalf("stats differ: plain %+v, sized %+v", ps, ss)
	}
	if sized.Stats().Entries < 500 {
		t.Fatalf("only %d entries: test too small", sized.Stats().Entries)
	}
	if len(sized.st.keys.g) != groups {
		t.Fatalf("sized key table grew from %d to %d groups", groups, len(sized.st.keys.g))
	}
	// Reserve on a filled index rehashes it: lookups unchanged, no
	// growth until the reserved size; a smaller Reserve changes nothing.
	plain.Reserve(20_000)
	if got := len(plain.st.keys.g); got != 2048 {
		t.Fatalf("reserved for 20,000: %d groups, want 2048", got)
	}
	plain.Reserve(10)
	if got := len(plain.st.keys.g); got != 2048 {
		t.Fatalf("Reserve(10) shrank the table to %d groups", got)
	}
	for q := range prompts {
		if got, want := plain.Lookup(keys[q], nil), sized.Lookup(keys[q], nil); !slices.Equal(got, want) {
			t.Fatalf("prompt %d after Reserve: %v, want %v", q, got, want)
		}
	}
	for _, cfg := range []Config{{ExpectedEntries: -1}, {MaxEntries: 100, ExpectedEntries: 101}} {
		if _, err := NewExact(cfg, nil, nil); err == nil {
			t.Errorf("%+v: want an error", cfg)
		}
		if _, err := NewApprox(cfg, nil, nil); err == nil {
			t.Errorf("approx %+v: want an error", cfg)
		}
	}
}
