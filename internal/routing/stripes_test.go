package routing

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"kvrouter/internal/kvindex"
	"kvrouter/internal/vllm"
)

// stripedRouters builds n router replicas over engines e0..e7, each with its
// own exact index fed the same KV event batch (e3 holds held's blocks), as
// n kvrouter replicas subscribed to the same engines. With striped false
// they are not told of each other (Routers unset).
func stripedRouters(t *testing.T, n int, striped bool, held []uint32, slack time.Duration) []*Router {
	t.Helper()
	c := &clock{t: time.Unix(1_000_000, 0)}
	var rs []*Router
	for k := range n {
		x, err := kvindex.NewExact(kvindex.Config{Model: "m", BlockSize: bs, Now: c.Now}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		cfg := Config{Now: c.Now, Rand: rand.New(rand.NewPCG(uint64(k), 7)), KV: KVConfig{StripeSlack: slack}}
		if striped {
			cfg.Routers, cfg.RouterIndex = n, k
		}
		r, err := New(cfg, x, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		for e := range 8 {
			r.AddReplica("e" + string(rune('0'+e)))
		}
		hs := make([]vllm.BlockHash, len(held)/bs)
		for i := range hs {
			hs[i] = vllm.BlockHash(i + 1)
		}
		x.Apply("e3", &vllm.Batch{Events: []vllm.Event{{Type: vllm.BlockStored, BlockHashes: hs, TokenIDs: held[:len(hs)*bs], BlockSize: bs}}})
		rs = append(rs, r)
	}
	return rs
}

// TestStripesSpreadSimultaneousRouters: four router replicas see the same
// events (e3 holds a 4-block system prompt every request starts with, a
// few milliseconds of prefill) and route two requests each at the same
// moment, none seeing the others' leases. Striped, they use eight distinct
// engines, each replica its own stripe (e_k, e_k+4); not striped, all four
// send their first request to e3 (the herding that cost kv 9% of its
// goodput at four replicas on the Mooncake trace). A continuation (e3
// holding most of the prompt), or a prompt a quarter held on e3, still goes
// to e3 from every replica, and one router is not affected by the stripe
// settings.
func TestStripesSpreadSimultaneousRouters(t *testing.T) {
	sys := tokens(1, 4*bs)
	burst := func(rs []*Router) (names []string) {
		for i := range 2 {
			for k, r := range rs {
				d, _, err := r.Route(&Request{Tokens: cat(sys, tokens(100+10*i+k, 2000)), MaxTokens: 100})
				if err != nil {
					t.Fatal(err)
				}
				names = append(names, d.Name)
			}
		}
		return names
	}
	// With e3 holding the system prompt (a near-tie the slack resolves),
	// and with nothing held and the slack off (exact ties: pickMin).
	for _, c := range []struct {
		held  []uint32
		slack time.Duration
	}{{sys, 0}, {nil, -1}} {
		got := burst(stripedRouters(t, 4, true, c.held, c.slack))
		for j, name := range got {
			k := j % 4
			if own := []string{"e" + string(rune('0'+k)), "e" + string(rune('4'+k))}; !slices.Contains(own, name) {
				t.Fatalf("slack %v: request %d of router %d on %s, want its stripe %v (all: %v)", c.slack, j, k, name, own, got)
			}
		}
		if u := slices.Compact(slices.Sorted(slices.Values(got))); len(u) != 8 {
			t.Fatalf("slack %v: striped: %v use %d engines, want 8", c.slack, got, len(u))
		}
	}
	herd := burst(stripedRouters(t, 4, false, sys, 0))
	for k := range 4 {
		if herd[k] != "e3" {
			t.Fatalf("not striped: first requests %v, want all on e3 (the shared cache signal)", herd[:4])
		}
	}
	// A continuation: e3 holds 40 of the prompt's 41 blocks.
	long := tokens(2, 40*bs)
	for k, r := range stripedRouters(t, 4, true, long, 0) {
		d, _, err := r.Route(&Request{Tokens: cat(long, tokens(300+k, bs)), MaxTokens: 100})
		if err != nil {
			t.Fatal(err)
		}
		if d.Name != "e3" {
			t.Fatalf("router %d sends a continuation to %s (%s), want e3", k, d.Name, d.Reason)
		}
	}
	// A quarter of the prompt held on e3 (no continuation for the
	// affinity slack, 51 ms of prefill): kept, not given up for a stripe.
	part := tokens(3, 32*bs)
	for k, r := range stripedRouters(t, 4, true, part, 0) {
		d, _, err := r.Route(&Request{Tokens: cat(part, tokens(400+k, 96*bs)), MaxTokens: 100})
		if err != nil {
			t.Fatal(err)
		}
		if d.Name != "e3" {
			t.Fatalf("router %d sends a prompt a quarter held on e3 to %s (%s), want e3", k, d.Name, d.Reason)
		}
	}
	one, plain := burst(stripedRouters(t, 1, true, sys, 0)), burst(stripedRouters(t, 1, false, sys, 0))
	if !slices.Equal(one, plain) || one[0] != "e3" {
		t.Fatalf("one router: striped %v, plain %v, want equal and the first on e3", one, plain)
	}
}

// TestStripeConfig: router_index must name one of the routers.
func TestStripeConfig(t *testing.T) {
	for _, c := range []struct{ n, k int }{{2, 2}, {0, 1}, {-1, 0}, {3, -1}} {
		if _, err := New(Config{Routers: c.n, RouterIndex: c.k}, nil, nil, nil); err == nil {
			t.Errorf("routers %d, router_index %d accepted", c.n, c.k)
		}
	}
	for _, c := range []struct{ n, k int }{{0, 0}, {1, 0}, {4, 3}} {
		if _, err := New(Config{Routers: c.n, RouterIndex: c.k}, nil, nil, nil); err != nil {
			t.Errorf("routers %d, router_index %d: %v", c.n, c.k, err)
		}
	}
}
