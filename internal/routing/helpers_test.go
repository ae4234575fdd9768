package routing

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"kvrouter/internal/kvindex"
	"kvrouter/internal/vllm"
)

const bs = 16

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// tokens returns n deterministic tokens of "text" id.
func tokens(id, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(id*1_000_003 + i)
	}
	return t
}

func cat(parts ...[]uint32) []uint32 {
	var out []uint32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// fleet is a Router over one kind of index, with a way to make a replica
// hold a prompt's blocks: KV events for the exact index, a routed decision
// for the approximate one.
type fleet struct {
	t     *testing.T
	kind  string
	clock *clock
	ix    Index
	r     *Router
	hold  func(name string, toks []uint32)
}

var indexKinds = []string{"exact", "approx"}

func newFleet(t *testing.T, kind, policy string, seed uint64, names ...string) *fleet {
	t.Helper()
	c := &clock{t: time.Unix(1_000_000, 0)}
	icfg := kvindex.Config{Model: "m", BlockSize: bs, Now: c.Now}
	f := &fleet{t: t, kind: kind, clock: c}
	switch kind {
	case "exact":
		x, err := kvindex.NewExact(icfg, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		f.ix = x
		next := uint64(1)
		f.hold = func(name string, toks []uint32) {
			n := len(toks) / bs
			hs := make([]vllm.BlockHash, n)
			for i := range hs {
				hs[i] = vllm.BlockHash(next)
				next++
			}
			x.Apply(name, &vllm.Batch{Events: []vllm.Event{{Type: vllm.BlockStored, BlockHashes: hs,
				TokenIDs: toks[:n*bs], BlockSize: bs}}})
		}
	case "approx":
		a, err := kvindex.NewApprox(icfg, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		f.ix = a
		f.hold = func(name string, toks []uint32) {
			id := a.AddReplica(name)
			a.Routed(id, kvindex.Keys(nil, toks, bs, kvindex.Extras{Root: a.Root()}))
		}
	default:
		t.Fatalf("kind %q", kind)
	}
	r, err := New(Config{Policy: policy, Now: c.Now, Rand: rand.New(rand.NewPCG(seed, 7))}, f.ix, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.r = r
	for _, n := range names {
		r.AddReplica(n)
	}
	return f
}

// route routes toks and returns the chosen name and lease.
func (f *fleet) route(toks []uint32, mod func(*Request)) (Decision, *Lease) {
	f.t.Helper()
	req := &Request{Tokens: toks, MaxTokens: 100}
	if mod != nil {
		mod(req)
	}
	d, l, err := f.r.Route(req)
	if err != nil {
		f.t.Fatal(err)
	}
	return d, l
}

// permutations returns every order of 0..n-1 (n <= 4).
func permutations(n int) [][]int {
	if n == 1 {
		return [][]int{{0}}
	}
	var out [][]int
	for _, p := range permutations(n - 1) {
		for i := 0; i <= len(p); i++ {
			q := append(append(append([]int{}, p[:i]...), n-1), p[i:]...)
			out = append(out, q)
		}
	}
	return out
}
