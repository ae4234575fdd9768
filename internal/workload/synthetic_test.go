package workload

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

func rng(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 1)) }

func commonPrefix(a, b []uint32) int {
	n := 0
	for n < min(len(a), len(b)) && a[n] == b[n] {
		n++
	}
	return n
}

func TestSegmentTokens(t *testing.T) {
	a := Segment{Key: 42, Len: 600}.AppendTokens(nil)
	b := Segment{Key: 42, Len: 600}.AppendTokens(nil)
	c := Segment{Key: 43, Len: 600}.AppendTokens(nil)
	if !slices.Equal(a, b) {
		t.Fatal("equal keys gave different tokens")
	}
	if commonPrefix(a, c) >= keyDigits {
		t.Fatal("different keys share their key digits")
	}
	short := Segment{Key: 42, Len: 10}.AppendTokens(nil)
	if !slices.Equal(short, a[:10]) {
		t.Fatal("a shorter segment is not a prefix of the longer one")
	}
	for _, tok := range append(a, c...) {
		if tok < TokenBase || tok >= TokenBase+TokenSpan {
			t.Fatalf("token %d out of range", tok)
		}
	}
	// mix64 is a bijection: spot-check injectivity on a range of keys.
	seen := map[uint64]bool{}
	for k := range uint64(1 << 16) {
		m := mix64(k<<40 | k)
		if seen[m] {
			t.Fatalf("mix64 collision at %d", k)
		}
		seen[m] = true
	}
}

func TestGenerators(t *testing.T) {
	type check func(t *testing.T, w *Workload)
	cases := []struct {
		name  string
		gen   func(*rand.Rand) (*Workload, error)
		n     int
		check check
	}{
		{"shared prefix", SharedPrefix{Groups: 4, Prompts: 5, SystemTokens: 1000, QuestionTokens: 50, OutputTokens: 8}.Generate, 20,
			func(t *testing.T, w *Workload) {
				for i := range w.Requests {
					for j := range w.Requests {
						a, b := &w.Requests[i], &w.Requests[j]
						n := commonPrefix(a.Tokens(), b.Tokens())
						switch {
						case i == j:
						case a.Session == b.Session && (n < 1000 || n >= 1000+keyDigits):
							t.Fatalf("%s and %s (same group) share %d tokens", a.ID, b.ID, n)
						case a.Session != b.Session && n >= keyDigits:
							t.Fatalf("%s and %s (other groups) share %d tokens", a.ID, b.ID, n)
						}
					}
				}
			}},
		{"multi-turn", MultiTurn{Conversations: 6, Turns: 4, SystemTokens: 300, UserTokens: 40, OutputTokens: 20}.Generate, 24,
			func(t *testing.T, w *Workload) {
				last := map[string][]uint32{}
				for _, r := range w.Requests {
					toks := r.Tokens()
					if prev, ok := last[r.Session]; ok {
						if len(toks) != len(prev)+60 || !slices.Equal(toks[:len(prev)], prev) {
							t.Fatalf("%s does not extend its previous turn", r.ID)
						}
					} else if !strings.HasSuffix(r.ID, "-t0") {
						t.Fatalf("%s comes before its conversation's first turn", r.ID)
					}
					last[r.Session] = toks
				}
			}},
		{"multi-turn shared system", MultiTurn{Conversations: 3, Turns: 2, SystemTokens: 100, UserTokens: 10, SharedSystem: true}.Generate, 6,
			func(t *testing.T, w *Workload) {
				a, b := w.Requests[0].Tokens(), w.Requests[len(w.Requests)-1].Tokens()
				if w.Requests[0].Session != w.Requests[len(w.Requests)-1].Session && commonPrefix(a, b) < 100 {
					t.Fatal("conversations do not share the system prompt")
				}
			}},
		{"unique", Unique{Requests: 50, PromptTokens: 64, OutputTokens: 4}.Generate, 50,
			func(t *testing.T, w *Workload) {
				firsts := map[[keyDigits]uint32]bool{}
				for _, r := range w.Requests {
					var k [keyDigits]uint32
					copy(k[:], r.Tokens())
					if firsts[k] {
						t.Fatalf("%s shares its first tokens with another request", r.ID)
					}
					firsts[k] = true
				}
			}},
		{"hot prefix", HotPrefix{Requests: 400, HotShare: 0.8, PrefixTokens: 256, SuffixTokens: 32, OutputTokens: 4}.Generate, 400,
			func(t *testing.T, w *Workload) {
				hot := Segment{key(nsHot, 0, 0, 0), 256}.AppendTokens(nil)
				n := 0
				for _, r := range w.Requests {
					if commonPrefix(r.Tokens(), hot) == 256 {
						n++
					}
				}
				if n < 280 || n > 360 {
					t.Fatalf("%d of 400 requests have the hot prefix, want about 320", n)
				}
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w, err := c.gen(rng(7))
			if err != nil {
				t.Fatal(err)
			}
			if len(w.Requests) != c.n {
				t.Fatalf("%d requests, want %d", len(w.Requests), c.n)
			}
			ids := map[string]bool{}
			for _, r := range w.Requests {
				if ids[r.ID] {
					t.Fatalf("duplicate id %s", r.ID)
				}
				ids[r.ID] = true
			}
			c.check(t, w)
			again, _ := c.gen(rng(7))
			for i := range w.Requests {
				if w.Requests[i].ID != again.Requests[i].ID {
					t.Fatal("same seed, different order")
				}
			}
		})
	}
}

func TestGeneratorValidation(t *testing.T) {
	bad := []func(*rand.Rand) (*Workload, error){
		SharedPrefix{Groups: 0, Prompts: 1, QuestionTokens: 1}.Generate,
		MultiTurn{Conversations: 1, Turns: 0, UserTokens: 1}.Generate,
		Unique{Requests: 1, PromptTokens: -1}.Generate,
		HotPrefix{Requests: 1, HotShare: 2, PrefixTokens: 1, SuffixTokens: 1}.Generate,
		HotPrefix{Requests: 1, HotShare: math.NaN(), PrefixTokens: 1, SuffixTokens: 1}.Generate,
	}
	for i, g := range bad {
		if _, err := g(rng(1)); err == nil {
			t.Errorf("case %d: invalid generator accepted", i)
		}
	}
}

func TestPoisson(t *testing.T) {
	w, _ := Unique{Requests: 20000, PromptTokens: 8}.Generate(nil)
	if err := Poisson(w, 50, rng(3)); err != nil {
		t.Fatal(err)
	}
	span := w.Requests[len(w.Requests)-1].At.Seconds()
	if rate := float64(len(w.Requests)-1) / span; math.Abs(rate-50) > 2 {
		t.Fatalf("measured rate %.2f, want 50 ± 2", rate)
	}
	if !slices.IsSortedFunc(w.Requests, func(a, b Request) int { return int(a.At - b.At) }) {
		t.Fatal("arrivals not sorted")
	}
	w2, _ := Unique{Requests: 20000, PromptTokens: 8}.Generate(nil)
	Poisson(w2, 50, rng(3))
	if w2.Requests[12345].At != w.Requests[12345].At {
		t.Fatal("same seed, different arrivals")
	}
	if err := Poisson(w, 0, rng(3)); err == nil {
		t.Fatal("rate 0 accepted")
	}
	if err := Scale(w, 2); err != nil || w.Requests[1].At != w2.Requests[1].At/2 {
		t.Fatalf("scale: %v", err)
	}
}

func TestRepeat(t *testing.T) {
	w, _ := SharedPrefix{Groups: 2, Prompts: 3, SystemTokens: 64, QuestionTokens: 8}.Generate(rng(1))
	Poisson(w, 10, rng(2))
	r, err := Repeat(w, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Requests) != 18 || r.Info().Requests != 18 {
		t.Fatalf("%d requests", len(r.Requests))
	}
	if !slices.IsSortedFunc(r.Requests, func(a, b Request) int { return int(a.At - b.At) }) {
		t.Fatal("copies overlap in time")
	}
	if n := commonPrefix(r.Requests[0].Tokens(), r.Requests[6].Tokens()); n >= keyDigits {
		t.Fatalf("copies share %d tokens", n)
	}
	if _, err := Repeat(r, 2); err == nil {
		t.Fatal("repeat of a repeat accepted")
	}
	if _, err := Repeat(w, 9); err == nil {
		t.Fatal("9 copies accepted")
	}
	if in := w.Info(); in.InputTokens != 6*72 || in.DurationS <= 0 || time.Duration(in.DurationS*1e9) != w.Requests[5].At {
		t.Fatalf("info %+v", in)
	}
}
