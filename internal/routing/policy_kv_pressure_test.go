package routing

import (
	"fmt"
	"testing"
	"time"

	"kvrouter/internal/kvindex"
)

// TestKVSharedPromptDoesNotPileOntoFullHolder: replica a holds a 2,048-token
// system prompt (128 blocks) and its cache is full (capacity 400 blocks,
// other conversations' histories in the rest); b, c and d hold nothing.
// Twenty new conversations open with the system prompt and a 256-token
// question, one at a time (light load), and each is cached where it went
// (144 blocks on a replica without the prompt, 16 with it). Placing one on
// a writes 2,660 tokens (question, 100 output tokens, and its prompt once
// more for the next turn) = 167 blocks over a full cache: 0.267 s of
// eviction plus 0.026 s of prefill, against 0.230 s of prefill on an empty
// replica. So while another replica has room for those 167 blocks, a gets
// none: the prompt is copied to replicas with room. Before the cache
// pressure and the session rule, a won every one by the affinity slack (it
// held half the prompt more than every other replica). Run through a
// Router over the approximate index too, so that Router.SetCapacity and the
// index's held blocks reach the policy.
func TestKVSharedPromptDoesNotPileOntoFullHolder(t *testing.T) {
	const capacity, system, footprint = 400, 128, 167
	type replica struct {
		held      int
		hasSystem bool
	}
	p, err := NewPolicy("kv", seeded(5))
	if err != nil {
		t.Fatal(err)
	}
	reps := map[string]*replica{"a": {held: capacity, hasSystem: true}, "b": {}, "c": {}, "d": {}}
	names := []string{"a", "b", "c", "d"}
	for i := range 20 {
		cands := make([]Candidate, len(names))
		room := false
		for j, n := range names {
			r := reps[n]
			cands[j] = Candidate{Name: n, Held: r.held, Capacity: capacity,
				Load: Load{PrefillRate: 10000, DecodeRate: 2000}}
			if r.hasSystem {
				cands[j].Match.GPU = system
			}
			room = room || (n != "a" && capacity-r.held >= footprint)
		}
		d := p.Pick(&Request{PromptTokens: 2304, MaxTokens: 100, SessionKey: fmt.Sprintf("conv-%d", i)}, cands)
		if d.Name == "a" && room {
			t.Fatalf("conversation %d went to the full holder a (%s) while another replica had room; terms %+v", i, d.Reason, d.Terms)
		}
		r := reps[d.Name]
		if r.hasSystem {
			r.held += 16
		} else {
			r.held, r.hasSystem = r.held+system+16, true
		}
	}

	f := newFleet(t, "approx", "kv", 1, "a", "b", "c", "d")
	for _, n := range names {
		f.r.SetCapacity(n, capacity)
	}
	sys := tokens(1, system*bs)
	f.hold("a", sys)
	f.hold("a", tokens(2, (capacity-system)*bs))
	for i := range 6 {
		prompt := cat(sys, tokens(100+i, 256))
		d, l := f.route(prompt, func(r *Request) { r.SessionKey = fmt.Sprintf("conv-%d", i) })
		l.Release()
		if d.Name == "a" {
			t.Errorf("router: conversation %d went to the full holder a (%s); terms %+v", i, d.Reason, d.Terms)
		}
	}
}

// TestKVConversationStaysWithItsHistory: four idle replicas hold a shared
// 1,024-token system prompt (64 blocks). A conversation's first turn goes
// anywhere (equal costs); its second turn (1,728 tokens: system, question,
// 192-token answer, question) finds its history, 92 blocks, only there, and
// that replica now has 1,000 tokens of another request queued (0.1 s at
// 10,000 tokens/s). Cost alone sends it to an idle replica (0.070 s against
// 0.133 s): its own history is 448 tokens, less than half the prompt, so
// the half-prompt rule gave it no slack and the conversation was split.
// Remembering the conversation's replica, any history held there counts:
// it stays (affinity). A new conversation whose prompt happens to extend
// the same blocks is not kept there: the excess is not its own history.
func TestKVConversationStaysWithItsHistory(t *testing.T) {
	load := func(inFlight, queued int64) Load {
		return Load{InFlight: inFlight, QueuedPrefill: queued, PrefillRate: 10000, DecodeRate: 2000}
	}
	names := []string{"a", "b", "c", "d"}
	p, err := NewPolicy("kv", seeded(3))
	if err != nil {
		t.Fatal(err)
	}
	cands := make([]Candidate, len(names))
	for i, n := range names {
		cands[i] = Candidate{Name: n, Held: -1, Match: kvindex.Match{GPU: 64}, Load: load(0, 0)}
	}
	first := p.Pick(&Request{PromptTokens: 1280, SessionKey: "conv-1"}, cands)
	if first.Index < 0 {
		t.Fatalf("first turn: no pick")
	}
	for i := range cands {
		if i == first.Index {
			cands[i].Match.GPU, cands[i].Load = 92, load(1, 1000)
		}
	}
	for _, c := range []struct {
		session  string
		stay     bool
		evaluate bool
	}{{"conv-1", true, true}, {"conv-1", true, false}, {"conv-2", false, true}, {"", false, true}} {
		req := &Request{PromptTokens: 1728, SessionKey: c.session}
		var d Decision
		if c.evaluate {
			d = p.(Evaluator).Evaluate(req, cands)
		} else {
			d = p.Pick(req, cands)
		}
		if stayed := d.Name == first.Name; stayed != c.stay {
			t.Errorf("session %q (evaluate %v): went to %s (%s), history on %s, want stay %v; terms %+v",
				c.session, c.evaluate, d.Name, d.Reason, first.Name, c.stay, d.Terms)
		}
	}
}

// TestKVSpreadsNewConversations: replica a holds a 2,048-token system
// prompt; its cache size is unknown (no pressure term) and every replica
// is idle. Each new conversation (system prompt and a 256-token question)
// costs 0.026 s on a and 0.230 s elsewhere at 10,000 tokens/s, so the cost
// alone sends all eight to a, where their histories would grow in one
// cache. Within the 500 ms session spread they go to the replica with the
// fewest conversations: two each. With the spread off, a takes all eight.
func TestKVSpreadsNewConversations(t *testing.T) {
	for _, spread := range []time.Duration{0, -1} {
		cfg := seeded(2)
		cfg.KV.SessionSpread = spread
		p, err := NewPolicy("kv", cfg)
		if err != nil {
			t.Fatal(err)
		}
		holds := map[string]bool{"a": true}
		counts := map[string]int{}
		for i := range 8 {
			var cands []Candidate
			for _, n := range []string{"a", "b", "c", "d"} {
				c := Candidate{Name: n, Held: -1, Load: Load{PrefillRate: 10000, DecodeRate: 2000}}
				if holds[n] {
					c.Match.GPU = 128
				}
				cands = append(cands, c)
			}
			d := p.Pick(&Request{PromptTokens: 2304, MaxTokens: 100, SessionKey: fmt.Sprintf("conv-%d", i)}, cands)
			holds[d.Name] = true
			counts[d.Name]++
		}
		if spread == 0 {
			for _, n := range []string{"a", "b", "c", "d"} {
				if counts[n] != 2 {
					t.Errorf("spread on: conversations per replica %v, want 2 each", counts)
					break
				}
			}
		} else if counts["a"] != 8 {
			t.Errorf("spread off: conversations per replica %v, want all 8 on a (the cost alone)", counts)
		}
	}
}

// TestKVHomeWithoutHistoryDoesNotHold: every replica's cache is full
// (capacity 400 blocks, all held) and holds the shared 1,024-token system
// prompt (64 blocks). A conversation's first turn went to some replica,
// its home; by its second turn (1,728 tokens) home's cache has evicted the
// conversation's history and kept only the system prompt, as every other
// replica has, and home has requests queued. Wherever the turn goes it
// writes the same blocks, so staying home saves nothing: the cost decides
// and the turn goes to an idle replica. Before, a home holding no less
// than the others kept the turn within the affinity slack (home queued
// 0.5 s, reason affinity) and, the caches being full, past it too (home
// queued 5 s: every cheaper replica would evict, so the no-room rule held
// the turn behind the queue). With its own history still at home (80
// blocks against 64) the turn stays in both cases.
func TestKVHomeWithoutHistoryDoesNotHold(t *testing.T) {
	const capacity, system = 400, 64
	names := []string{"a", "b", "c", "d"}
	for _, c := range []struct {
		queued  int64 // prefill tokens queued at home
		history int32 // blocks home holds beyond the system prompt
		stay    bool
	}{
		{5000, 0, false}, {50000, 0, false},
		{5000, 16, true}, {50000, 16, true},
	} {
		p, err := NewPolicy("kv", seeded(4))
		if err != nil {
			t.Fatal(err)
		}
		cands := make([]Candidate, len(names))
		for i, n := range names {
			cands[i] = Candidate{Name: n, Held: capacity, Capacity: capacity, Match: kvindex.Match{GPU: system},
				Load: Load{PrefillRate: 10000, DecodeRate: 2000}}
		}
		first := p.Pick(&Request{PromptTokens: 1280, MaxTokens: 192, SessionKey: "conv-1"}, cands)
		if first.Index < 0 {
			t.Fatal("first turn: no pick")
		}
		h := &cands[first.Index]
		h.Match.GPU += c.history
		h.Load.InFlight, h.Load.QueuedPrefill = 4, c.queued
		d := p.Pick(&Request{PromptTokens: 1728, MaxTokens: 192, SessionKey: "conv-1"}, cands)
		if stayed := d.Name == first.Name; stayed != c.stay {
			t.Errorf("home %s with %d blocks of history and %d tokens queued: second turn went to %s (%s), want stay %v; terms %+v",
				first.Name, c.history, c.queued, d.Name, d.Reason, c.stay, d.Terms)
		}
	}
}

// TestKVEmptyHomeKeepsConversation: four replicas with full caches, none
// holding any of a conversation's prompt (its group's 2,048-token prefix
// and question; home has evicted all of it, as on shared_prefix with
// caches too small for every group). Every candidate would compute the
// whole prompt, so the costs differ only by load. Twenty such
// conversations, each remembered on a home, come back: while home costs
// no more than the cheapest (all idle) or at most EmptyHomeSlack (100 ms)
// more (500 queued tokens, 50 ms at 10,000 tokens/s), each stays home.
// Before, the cost decided: equal costs went at random, so about three in
// four moved, and any queue at home moved it. With 0.5 s queued at home,
// or the slack off, the cost decides; so it does when another replica has
// room (just added, say): for a 320-token prompt that replica is cheaper
// only by the eviction it avoids, 77 ms (its prompt twice and 128 output
// tokens, 48 blocks, at 10,000 tokens/s), within the slack, yet the
// conversation moves there.
func TestKVEmptyHomeKeepsConversation(t *testing.T) {
	const capacity = 400
	names := []string{"a", "b", "c", "d"}
	for _, c := range []struct {
		queued int64
		slack  time.Duration
		room   bool // another replica's cache has room
		prompt int
		stay   bool
	}{
		{0, 0, false, 2304, true}, {500, 0, false, 2304, true}, {5000, 0, false, 2304, false},
		{500, -1, false, 2304, false}, {0, 0, true, 320, false},
	} {
		cfg := seeded(6)
		cfg.KV.EmptyHomeSlack = c.slack
		p, err := NewPolicy("kv", cfg)
		if err != nil {
			t.Fatal(err)
		}
		stayed := 0
		for i := range 20 {
			session := fmt.Sprintf("group-%d", i)
			cands := make([]Candidate, len(names))
			for j, n := range names {
				cands[j] = Candidate{Name: n, Held: capacity, Capacity: capacity,
					Load: Load{PrefillRate: 10000, DecodeRate: 2000}}
			}
			first := p.Pick(&Request{PromptTokens: c.prompt, MaxTokens: 128, SessionKey: session}, cands)
			if first.Index < 0 {
				t.Fatal("first request: no pick")
			}
			cands[first.Index].Load.QueuedPrefill = c.queued
			if c.room {
				cands[(first.Index+1)%len(cands)].Held = 0
			}
			if d := p.Pick(&Request{PromptTokens: c.prompt, MaxTokens: 128, SessionKey: session}, cands); d.Name == first.Name {
				stayed++
			}
		}
		if want := map[bool]int{true: 20, false: 0}[c.stay]; stayed != want {
			t.Errorf("%d tokens queued at home, slack %v, room elsewhere %v: %d of 20 conversations stayed home, want %d",
				c.queued, c.slack, c.room, stayed, want)
		}
	}
}
