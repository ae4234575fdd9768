package sim

import (
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"kvrouter/internal/bench/report"
	"kvrouter/internal/enginesim"
	"kvrouter/internal/kvindex"
	"kvrouter/internal/workload"
)

const tracePath = "../../testdata/mooncake/conversation_trace.jsonl.gz"

var loadTrace = sync.OnceValues(func() ([]workload.TraceRecord, error) {
	f, err := os.Open(tracePath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return workload.ReadTrace(f)
})

func trace(t testing.TB) []workload.TraceRecord {
	t.Helper()
	recs, err := loadTrace()
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// small is a quick workload: 24 groups x 20 prompts sharing 512-token
// system prompts, Poisson at rate rps.
func small(t testing.TB, rps float64) *workload.Workload {
	t.Helper()
	rng := rand.New(rand.NewPCG(3, 4))
	w, err := workload.SharedPrefix{Groups: 24, Prompts: 20, SystemTokens: 512, QuestionTokens: 64, OutputTokens: 16}.Generate(rng)
	if err != nil {
		t.Fatal(err)
	}
	if err := workload.Poisson(w, rps, rng); err != nil {
		t.Fatal(err)
	}
	return w
}

// smallEngine keeps caches small so that routing matters: 300 blocks of 16
// tokens hold about 8 prompts.
var smallEngine = enginesim.CoreConfig{NumGPUBlocks: 300, MaxModelLen: 4096}

func TestRunComparesPoliciesOnIdenticalArrivals(t *testing.T) {
	w := small(t, 40)
	cfg := Config{Replicas: 4, Engine: smallEngine, Policies: []string{"round_robin", "least_load", "kv", "session", "prefix_chars", "dynamo", "llmd", "sglang", "random", PolicyCacheGreedy}, Seed: 9}
	runs, err := Run(t.Context(), cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	res := map[string]report.PolicyResult{}
	for i, r := range runs {
		if r.Policy != cfg.Policies[i] {
			t.Fatalf("run %d is %s, want %s", i, r.Policy, cfg.Policies[i])
		}
		if len(r.Samples) != len(w.Requests) {
			t.Fatalf("%s: %d samples", r.Policy, len(r.Samples))
		}
		for j, s := range r.Samples {
			if s.ID != w.Requests[j].ID || s.Arrival != w.Requests[j].At {
				t.Fatalf("%s: sample %d is %s at %v, want %s at %v", r.Policy, j, s.ID, s.Arrival, w.Requests[j].ID, w.Requests[j].At)
			}
			if s.Err != "" || s.OutputTokens != 16 || s.FirstToken <= s.Arrival || s.End < s.FirstToken || s.PromptTokens != 576 {
				t.Fatalf("%s: sample %+v", r.Policy, s)
			}
		}
		if r.ITL.Count() != uint64(15*len(w.Requests)) {
			t.Errorf("%s: %d ITL gaps, want %d", r.Policy, r.ITL.Count(), 15*len(w.Requests))
		}
		res[r.Policy] = report.Summarize(r, report.SLO{TTFT: time.Second, ITL: 100 * time.Millisecond})
		t.Logf("%-12s hit %.3f ttft p50 %.1f goodput %.2f load %.2f", r.Policy, res[r.Policy].HitRate, res[r.Policy].TTFT.P50, res[r.Policy].GoodputRPS, res[r.Policy].MaxMeanLoad)
	}
	// 24 prompts of 512 shared tokens over 4 small caches: round_robin
	// spreads every group everywhere and thrashes; routing by prefix keeps
	// groups together.
	if res["kv"].HitRate < res["round_robin"].HitRate+0.2 {
		t.Errorf("kv hit rate %.3f not well above round_robin's %.3f", res["kv"].HitRate, res["round_robin"].HitRate)
	}
	if res[PolicyCacheGreedy].HitRate < res["round_robin"].HitRate+0.2 {
		t.Errorf("cache_greedy hit rate %.3f not well above round_robin's %.3f", res[PolicyCacheGreedy].HitRate, res["round_robin"].HitRate)
	}
	if b := HitRateBound(w, 16); res["kv"].HitRate > b || res[PolicyCacheGreedy].HitRate > b {
		t.Errorf("hit rates %.3f, %.3f above the bound %.3f", res["kv"].HitRate, res[PolicyCacheGreedy].HitRate, b)
	}
}

func TestRunDeterministic(t *testing.T) {
	w := small(t, 60)
	cfg := Config{Replicas: 3, Engine: smallEngine, Policies: []string{"kv", "random"}, Seed: 5, EventDelay: 20 * time.Millisecond, EventLoss: 0.1}
	a, err := Run(t.Context(), cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Parallel = 1
	b, err := Run(t.Context(), cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	for i := range a {
		if !slices.Equal(a[i].Samples, b[i].Samples) {
			t.Fatalf("%s: two runs with one seed differ", a[i].Policy)
		}
	}
}

// TestRunPolicyIndependentOfList: a policy's run (its random tie-breaks and
// event losses included) is the same alone and listed with others, in any
// order.
func TestRunPolicyIndependentOfList(t *testing.T) {
	w := small(t, 60)
	cfg := Config{Replicas: 3, Engine: smallEngine, Seed: 5, EventDelay: 20 * time.Millisecond, EventLoss: 0.2}
	runs := map[string][]*report.Run{}
	for _, list := range [][]string{{"random", "kv"}, {"kv", "random"}, {"kv"}, {"random"}} {
		cfg.Policies = list
		rs, err := Run(t.Context(), cfg, w)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			runs[r.Policy] = append(runs[r.Policy], r)
		}
	}
	for p, rs := range runs {
		for _, r := range rs[1:] {
			if !slices.Equal(r.Samples, rs[0].Samples) {
				t.Errorf("%s: the run depends on the policies listed with it", p)
			}
		}
	}
}

// TestEventDelayAndLoss: the index only knows what events tell it, so
// losing all of them (and predictions off) leaves kv blind.
func TestEventDelayAndLoss(t *testing.T) {
	w := small(t, 40)
	hit := func(loss float64, delay time.Duration) float64 {
		cfg := Config{Replicas: 4, Engine: smallEngine, Policies: []string{"kv"}, EventLoss: loss, EventDelay: delay, Seed: 1}
		cfg.Index.PredictTTL = -1
		runs, err := Run(t.Context(), cfg, w)
		if err != nil {
			t.Fatal(err)
		}
		return report.Summarize(runs[0], report.SLO{}).HitRate
	}
	ok, lost, late := hit(0, 0), hit(1, 0), hit(0, time.Hour)
	if lost > ok-0.2 || late > ok-0.2 {
		t.Fatalf("hit rate %.3f with events, %.3f with all lost, %.3f with all late", ok, lost, late)
	}
}

func TestScaleOutAndIn(t *testing.T) {
	w := small(t, 40)
	span := w.Requests[len(w.Requests)-1].At
	add, remove := span/3, 2*span/3
	cfg, err := Config{Replicas: 2, Engine: smallEngine, Scale: []Scale{{At: remove, Delta: -1}, {At: add, Delta: 2}}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"kv", "least_load", PolicyCacheGreedy} {
		f, err := newFleet(cfg, p, w, 1)
		if err != nil {
			t.Fatal(err)
		}
		run, err := f.simulate(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(run.Replicas, []string{"r00", "r01", "r02", "r03"}) {
			t.Fatalf("%s: replicas %v", p, run.Replicas)
		}
		got := map[string]int{}
		for _, s := range run.Samples {
			if s.Err != "" {
				t.Fatalf("%s: %+v", p, s)
			}
			got[s.Replica]++
			if (s.Replica == "r02" || s.Replica == "r03") && s.Arrival < add {
				t.Fatalf("%s: %s routed to %s before it was added", p, s.ID, s.Replica)
			}
			if s.Replica == "r03" && s.Arrival >= remove {
				t.Fatalf("%s: %s routed to r03 after it was removed", p, s.ID)
			}
		}
		if got["r02"] == 0 || got["r03"] == 0 {
			t.Errorf("%s: added replicas got no traffic: %v", p, got)
		}
		// Every lease was released: the router's loads are back to zero.
		if f.router != nil {
			for _, name := range []string{"r00", "r01", "r02"} {
				if l, _ := f.router.Load(name); l.InFlight != 0 || l.QueuedPrefill != 0 || l.RunningDecode != 0 {
					t.Errorf("%s: %s load after the run: %+v", p, name, l)
				}
			}
		}
		for _, r := range f.reps {
			if !r.core.Idle() || r.load != 0 {
				t.Errorf("%s: %s not idle after the run", p, r.name)
			}
		}
	}
}

func TestRejectedRequests(t *testing.T) {
	w := small(t, 40)
	w.Requests[3].OutputTokens = 4000 // 576 + 4000 > max_model_len 4096
	runs, err := Run(t.Context(), Config{Replicas: 2, Engine: smallEngine, Policies: []string{"kv", PolicyCacheGreedy}}, w)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range runs {
		if r.Samples[3].Err != "rejected" || report.Summarize(r, report.SLO{}).Errors != 1 {
			t.Errorf("%s: sample %+v", r.Policy, r.Samples[3])
		}
	}
}

func TestConfigErrors(t *testing.T) {
	bad := []Config{
		{Replicas: -1},
		{Policies: []string{"nope"}},
		{Policies: []string{"kv", "kv"}},
		{EventLoss: 2},
		{EventDelay: -time.Second},
		{Replicas: 2, Scale: []Scale{{At: time.Second, Delta: -2}}},
	}
	for _, c := range bad {
		if _, err := Run(t.Context(), c, &workload.Workload{}); err == nil {
			t.Errorf("config %+v accepted", c)
		}
	}
}

// TestHitRateBoundMatchesTokens checks the segment-level bound against a
// brute-force count over real block keys on a slice of the Mooncake trace
// and on synthetic workloads.
func TestHitRateBoundMatchesTokens(t *testing.T) {
	mc, err := workload.Mooncake(trace(t), workload.MooncakeOptions{Limit: 600, MaxInputTokens: 3000})
	if err != nil {
		t.Fatal(err)
	}
	mt, _ := workload.MultiTurn{Conversations: 20, Turns: 4, SystemTokens: 100, UserTokens: 37, OutputTokens: 23, SharedSystem: true}.Generate(rand.New(rand.NewPCG(1, 1)))
	for _, w := range []*workload.Workload{mc, mt, small(t, 1)} {
		for _, bs := range []int{16, 64} {
			seen := map[kvindex.Key]bool{}
			var prompt, hit int
			var keys []kvindex.Key
			for _, r := range w.Requests {
				toks := r.Tokens()
				keys = kvindex.Keys(keys, toks, bs, kvindex.Extras{})
				n := 0
				for n < len(keys) && seen[keys[n]] {
					n++
				}
				hit += min(n*bs, (len(toks)-1)/bs*bs)
				prompt += len(toks)
				for _, k := range keys {
					seen[k] = true
				}
			}
			want := float64(hit) / float64(prompt)
			if got := HitRateBound(w, bs); got != want {
				t.Errorf("%s, block %d: bound %v, brute force %v", w.Name, bs, got, want)
			}
		}
	}
}

func TestScenarios(t *testing.T) {
	for _, s := range Scenarios() {
		t.Run(s.Name, func(t *testing.T) {
			sc, err := BuildScenario(s.Name, ScenarioOptions{Replicas: 8, Requests: 300, Trace: trace(t), Seed: 2})
			if err != nil {
				t.Fatal(err)
			}
			w := sc.Workload
			if len(w.Requests) < 250 || !slices.IsSortedFunc(w.Requests, func(a, b workload.Request) int { return int(a.At - b.At) }) {
				t.Fatalf("%d requests, sorted %v", len(w.Requests), slices.IsSortedFunc(w.Requests, func(a, b workload.Request) int { return int(a.At - b.At) }))
			}
			// The offered load is as asked: prompt tokens/s over capacity.
			in := w.Info()
			load := float64(in.InputTokens) / in.DurationS / (8 * 20000)
			if want := DefaultLoad(s.Name); load < want*0.8 || load > want*1.25 {
				t.Errorf("offered load %.2f, want about %.2f", load, want)
			}
			if (s.Name == "scale_out") != (len(sc.Scale) == 1) || s.Name == "scale_out" && (sc.Replicas != 4 || sc.Scale[0].Delta != 4) {
				t.Errorf("replicas %d, scale %+v", sc.Replicas, sc.Scale)
			}
		})
	}
	if _, err := BuildScenario("nope", ScenarioOptions{}); err == nil {
		t.Error("unknown scenario accepted")
	} else if !strings.Contains(err.Error(), "hot_prefix") || !strings.Contains(err.Error(), "long_prompt") {
		t.Errorf("unknown scenario: %v, want the known ones listed", err)
	}
	if _, err := BuildScenario("mooncake", ScenarioOptions{}); err == nil {
		t.Error("mooncake without a trace accepted")
	}
}

// TestRunDraw: a draw reruns the seed's arrivals with other random choices.
// Draw 0 is the seed's own run; another draw keeps every request's arrival
// and prompt, is itself reproducible, and moves the choices that were
// random: random's picks and session's placement of the renamed
// conversations.
func TestRunDraw(t *testing.T) {
	w := small(t, 60)
	cfg := Config{Replicas: 4, Engine: smallEngine, Policies: []string{"random", "session", "round_robin"}, Seed: 5}
	byDraw := map[uint64][]*report.Run{}
	for _, d := range []uint64{0, 1, 1} {
		cfg.Draw = d
		rs, err := Run(t.Context(), cfg, w)
		if err != nil {
			t.Fatal(err)
		}
		if prev, ok := byDraw[d]; ok {
			for i := range rs {
				if !slices.Equal(rs[i].Samples, prev[i].Samples) {
					t.Errorf("draw %d, %s: two runs differ", d, rs[i].Policy)
				}
			}
		}
		byDraw[d] = rs
	}
	a, b := byDraw[0], byDraw[1]
	for i := range a {
		moved := 0
		for j := range a[i].Samples {
			sa, sb := a[i].Samples[j], b[i].Samples[j]
			if sa.ID != sb.ID || sa.Arrival != sb.Arrival || sa.PromptTokens != sb.PromptTokens {
				t.Fatalf("%s: request %d is %s at %v (%d tokens) in draw 0, %s at %v (%d) in draw 1",
					a[i].Policy, j, sa.ID, sa.Arrival, sa.PromptTokens, sb.ID, sb.Arrival, sb.PromptTokens)
			}
			if sa.Replica != sb.Replica {
				moved++
			}
		}
		switch p := a[i].Policy; {
		case p == "round_robin" && moved != 0:
			t.Errorf("round_robin has no random choice, but %d of %d requests moved between draws", moved, len(w.Requests))
		case p != "round_robin" && moved < len(w.Requests)/4:
			t.Errorf("%s: %d of %d requests moved between draws 0 and 1, want at least a quarter", p, moved, len(w.Requests))
		}
	}
}
