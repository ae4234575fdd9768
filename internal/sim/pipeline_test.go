package sim

import (
	"bytes"
	"context"
	"errors"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"kvrouter/internal/bench/report"
	"kvrouter/internal/enginesim"
	"kvrouter/internal/vllm"
	"kvrouter/internal/workload"
)

// mooncakeSmall is the first n records of the vendored Mooncake trace at
// the scenario's default load for replicas.
func mooncakeSmall(t testing.TB, replicas, n int) *workload.Workload {
	t.Helper()
	sc, err := BuildScenario("mooncake", ScenarioOptions{Replicas: replicas, Requests: n, Trace: trace(t)})
	if err != nil {
		t.Fatal(err)
	}
	return sc.Workload
}

// TestPipelineIdenticalRuns: the pipelined simulator gives exactly the
// sequential one's runs (every Sample, ITL, replicas, preemptions, hit
// rates, and the JSON and markdown reports byte for byte), with and
// without event delay and loss, across a scale-in and a scale-out, on the
// Mooncake trace and on a shared-prefix workload with small caches (many
// evictions), for policies with and without an index. Pipelining from the
// start (on) and switching it on mid-run (auto, once a policy is the last
// one running on 2 or more cores) are both compared with off.
func TestPipelineIdenticalRuns(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	mc := mooncakeSmall(t, 8, 100)
	sp := small(t, 40)
	cases := []struct {
		name  string
		w     *workload.Workload
		eng   enginesim.CoreConfig
		delay time.Duration
		loss  float64
	}{
		{"mooncake/delay=0/loss=0", mc, enginesim.CoreConfig{}, 0, 0},
		{"mooncake/delay=30ms/loss=0.1", mc, enginesim.CoreConfig{}, 30 * time.Millisecond, 0.1},
		{"shared_prefix/delay=0/loss=0", sp, smallEngine, 0, 0},
		{"shared_prefix/delay=50ms/loss=0.2", sp, smallEngine, 50 * time.Millisecond, 0.2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			last := c.w.Requests[len(c.w.Requests)-1].At
			cfg := Config{
				Replicas: 8, Policies: []string{"kv", "dynamo", "round_robin"}, Engine: c.eng, Seed: 11,
				Scale:      []Scale{{At: last / 3, Delta: -3}, {At: last * 2 / 3, Delta: 4}},
				EventDelay: c.delay, EventLoss: c.loss, Pipeline: PipelineOff,
			}
			want, err := Run(t.Context(), cfg, c.w)
			if err != nil {
				t.Fatal(err)
			}
			// On pipelines every index-keeping fleet; auto (switching on
			// mid-run) pipelines only with GOMAXPROCS >= 2, else it is off
			// and this comparison is trivial; TestPipelineAuto checks the
			// switch itself.
			for _, mode := range []PipelineMode{PipelineOn, PipelineAuto} {
				cfg.Pipeline = mode
				got, err := Run(t.Context(), cfg, c.w)
				if err != nil {
					t.Fatal(err)
				}
				for i := range want {
					compareRuns(t, string(mode), want[i], got[i])
				}
				if a, b := reportBytes(t, c.w, want), reportBytes(t, c.w, got); a != b {
					t.Errorf("%s: reports differ\n got %s\nwant %s", mode, b, a)
				}
			}
			// The scenario exercises what it should: hits and scaling.
			kv := want[0]
			if r := report.Summarize(kv, cfg.SLO); !(r.HitRate > 0) || r.Errors != 0 || len(kv.Replicas) != 12 {
				t.Errorf("kv: hit rate %v, errors %d, replicas %v", r.HitRate, r.Errors, kv.Replicas)
			}
		})
	}
}

// compareRuns fails unless got equals want field by field: every Sample,
// the ITL histogram, replicas, preemptions, and their report rows (hit
// rate included).
func compareRuns(t *testing.T, mode string, want, got *report.Run) {
	t.Helper()
	if len(got.Samples) != len(want.Samples) {
		t.Fatalf("%s %s: %d samples, want %d", mode, want.Policy, len(got.Samples), len(want.Samples))
	}
	for j := range want.Samples {
		if got.Samples[j] != want.Samples[j] {
			t.Fatalf("%s %s: sample %d\n got %+v\nwant %+v", mode, want.Policy, j, got.Samples[j], want.Samples[j])
		}
	}
	if !reflect.DeepEqual(got.ITL, want.ITL) {
		t.Errorf("%s %s: ITL differs: %d gaps (mean %v), want %d (mean %v)", mode, want.Policy, got.ITL.Count(), got.ITL.Mean(), want.ITL.Count(), want.ITL.Mean())
	}
	if !slices.Equal(got.Replicas, want.Replicas) || got.Preemptions != want.Preemptions || got.Policy != want.Policy {
		t.Errorf("%s %s: replicas %v, preemptions %d; want %v, %d", mode, want.Policy, got.Replicas, got.Preemptions, want.Replicas, want.Preemptions)
	}
	slo := report.SLO{TTFT: DefaultSLOTTFT, ITL: DefaultSLOITL}
	if a, b := report.Summarize(want, slo), report.Summarize(got, slo); a.HitRate != b.HitRate || a.Requests != b.Requests || a.Errors != b.Errors {
		t.Errorf("%s %s: hit rate %v, requests %d, errors %d; want %v, %d, %d", mode, want.Policy, b.HitRate, b.Requests, b.Errors, a.HitRate, a.Requests, a.Errors)
	}
}

// reportBytes renders runs as the JSON and markdown reports kvrouter sim
// prints.
func reportBytes(t *testing.T, w *workload.Workload, runs []*report.Run) string {
	t.Helper()
	rep := report.New("pipeline", w.Info(), runs, report.SLO{TTFT: DefaultSLOTTFT, ITL: DefaultSLOITL})
	var b bytes.Buffer
	if err := rep.JSON(&b); err != nil {
		t.Fatal(err)
	}
	if err := rep.Markdown(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// recorder is a batchApplier that records what it is given.
type recorder struct {
	now     *time.Duration
	got     []string
	at      []time.Duration
	hashes  []vllm.BlockHash
	panicAt int // panic on this batch (1-based; 0: never)
}

func (r *recorder) Apply(engine string, b *vllm.Batch) {
	if len(r.got)+1 == r.panicAt {
		panic("boom")
	}
	r.got = append(r.got, engine)
	r.at = append(r.at, *r.now)
	for _, e := range b.Events {
		r.hashes = append(r.hashes, e.BlockHashes...)
	}
}

// TestPipelineOrderAndCopy: batches reach the applier in push order, each
// with its apply time, and intact although the caller reuses its event
// slice right after push (as a core does at its next Step); sync waits for
// all of them; more batches than the queue holds make push wait; large
// batches close a chunk early (chunkEvents).
func TestPipelineOrderAndCopy(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	var now time.Duration
	rec := &recorder{now: &now}
	p := newPipeline(rec, &now)
	defer p.stop()
	n := 3*chunkBatches*maxChunks + 5
	buf := make([]vllm.Event, chunkEvents+1)
	var want []vllm.BlockHash
	copied := 0
	for i := range n {
		evs := buf[:2]
		if i%251 == 0 {
			evs = buf
		}
		copied += len(evs)
		for j := range evs { // overwrite the caller's slice, as a core does
			h := vllm.BlockHash(i<<16 | j)
			evs[j] = vllm.Event{Type: vllm.BlockStored, BlockHashes: []vllm.BlockHash{h}}
			want = append(want, h)
		}
		if err := p.push(string(rune('a'+i%26)), time.Duration(i), &vllm.Batch{Events: evs}); err != nil {
			t.Fatal(err)
		}
		if i == n/2 {
			if err := p.sync(); err != nil {
				t.Fatal(err)
			}
			if len(rec.got) != i+1 {
				t.Fatalf("after sync: %d batches applied, want %d", len(rec.got), i+1)
			}
		}
	}
	if err := p.sync(); err != nil {
		t.Fatal(err)
	}
	if len(rec.got) != n || !slices.Equal(rec.hashes, want) {
		t.Fatalf("applied %d batches, %d hashes; want %d, %d", len(rec.got), len(rec.hashes), n, len(want))
	}
	for i := range n {
		if rec.got[i] != string(rune('a'+i%26)) || rec.at[i] != time.Duration(i) {
			t.Fatalf("batch %d: %s at %v", i, rec.got[i], rec.at[i])
		}
	}
	if c := p.copied.Load(); c != int64(copied) {
		t.Errorf("copied %d events, want %d", c, copied)
	}
	// sync with nothing queued returns at once; stop is idempotent.
	if err := p.sync(); err != nil {
		t.Fatal(err)
	}
	p.stop()
}

// TestPipelinePanic: a panic in the applier comes back from sync (and from
// push once it waits) as an error; the goroutine exits.
func TestPipelinePanic(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	var now time.Duration
	p := newPipeline(&recorder{now: &now, panicAt: 3}, &now)
	var err error
	for i := 0; i < 2*chunkBatches*maxChunks && err == nil; i++ {
		err = p.push("r", 0, &vllm.Batch{})
	}
	if err == nil {
		err = p.sync()
	}
	if err == nil || !strings.Contains(err.Error(), "panic: boom") {
		t.Fatalf("err %v, want the applier's panic", err)
	}
	if err := p.sync(); err == nil {
		t.Fatal("sync after a panic: no error")
	}
	p.stop()
}

// TestPipelinePanicEndsRun: the fleet returns the applier's panic as the
// run's error.
func TestPipelinePanicEndsRun(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	w := mooncakeSmall(t, 4, 50)
	cfg, err := Config{Replicas: 4, Policies: []string{"kv"}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	f, err := newFleet(cfg, "kv", w, 1)
	if err != nil {
		t.Fatal(err)
	}
	f.pipe = newPipeline(&recorder{now: &f.ixAt, panicAt: 5}, &f.ixAt)
	if _, err := f.simulate(t.Context()); err == nil || !strings.Contains(err.Error(), "sim kv: index applier panic: boom") {
		t.Fatalf("err %v, want the applier's panic", err)
	}
}

// cancelAfter is a context whose Err turns Canceled after n calls: the run
// stops mid-way at a point that does not depend on timing.
type cancelAfter struct {
	context.Context
	n int
}

func (c *cancelAfter) Err() error {
	if c.n--; c.n < 0 {
		return context.Canceled
	}
	return nil
}

// TestPipelineCancel: a cancelled run returns ctx's error and leaves no
// applier goroutine behind, whether cancelled at the start or mid-run
// (with batches queued).
func TestPipelineCancel(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	w := mooncakeSmall(t, 4, 200)
	for _, n := range []int{0, 3} {
		cfg := Config{Replicas: 4, Policies: []string{"kv"}, Pipeline: PipelineOn}
		if _, err := Run(&cancelAfter{Context: t.Context(), n: n}, cfg, w); !errors.Is(err, context.Canceled) {
			t.Fatalf("cancel after %d checks: err %v", n, err)
		}
	}
}

// TestPipelineAuto: under PipelineAuto a fleet pipelines exactly when a
// core is free; PipelineOff never does, nor does a policy without index.
func TestPipelineAuto(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	w := mooncakeSmall(t, 4, 40)
	for _, c := range []struct {
		policy   string
		mode     PipelineMode
		coreFree bool
		want     bool
	}{
		{"kv", PipelineAuto, true, true},
		{"kv", PipelineAuto, false, false},
		{"kv", PipelineOn, false, true},
		{"kv", PipelineOff, false, false},
		{"round_robin", PipelineOn, true, false},
	} {
		cfg, err := Config{Replicas: 4, Policies: []string{c.policy}, Pipeline: c.mode}.withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		f, err := newFleet(cfg, c.policy, w, 1)
		if err != nil {
			t.Fatal(err)
		}
		if c.mode == PipelineAuto {
			f.coreFree = func() bool { return c.coreFree }
		}
		if _, err := f.simulate(t.Context()); err != nil {
			t.Fatal(err)
		}
		if got := f.pipe != nil; got != c.want {
			t.Errorf("%s %s core free %v: pipelined %v, want %v", c.policy, c.mode, c.coreFree, got, c.want)
		}
	}
}

func TestPipelineConfig(t *testing.T) {
	cfg, err := Config{}.withDefaults()
	if err != nil || cfg.Pipeline != PipelineAuto {
		t.Fatalf("default pipeline %q, err %v", cfg.Pipeline, err)
	}
	if _, err := (Config{Pipeline: "yes"}).withDefaults(); err == nil || !strings.Contains(err.Error(), `pipeline "yes"`) {
		t.Fatalf("bad pipeline mode: err %v", err)
	}
}

// BenchmarkPipeline runs the issue's workload (the Mooncake conversation
// trace twice, 24,062 requests, 64 replicas) with the kv policy alone and
// with the default four policies, under each Config.Pipeline mode; s/run is
// the wall time (compare with -count and user+sys from /usr/bin/time).
// Each run takes seconds:
//
//	go test -run '^$' -bench BenchmarkPipeline/ -benchtime 1x ./internal/sim/
func BenchmarkPipeline(b *testing.B) {
	w := issueWorkload(b)
	for _, pol := range []string{"kv", "default"} {
		for _, mode := range []PipelineMode{PipelineOff, PipelineOn, PipelineAuto} {
			b.Run("policies="+pol+"/pipeline="+string(mode), func(b *testing.B) {
				cfg := Config{Replicas: 64, Pipeline: mode}
				if pol != "default" {
					cfg.Policies = []string{pol}
				}
				b.ReportAllocs()
				for b.Loop() {
					if _, err := Run(b.Context(), cfg, w); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(len(w.Requests)*b.N)/b.Elapsed().Seconds(), "requests/s")
				b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/run")
			})
		}
	}
}

// nopApplier applies nothing.
type nopApplier struct{}

func (nopApplier) Apply(string, *vllm.Batch) {}

// BenchmarkPipelinePush is the fleet goroutine's cost of handing a batch of
// events to the pipeline (the copy included), with an applier that does
// nothing:
//
//	go test -run '^$' -bench BenchmarkPipelinePush -benchtime 1s ./internal/sim/
func BenchmarkPipelinePush(b *testing.B) {
	for _, n := range []int{1, 4, 16} {
		b.Run("events="+strconv.Itoa(n), func(b *testing.B) {
			var now time.Duration
			p := newPipeline(nopApplier{}, &now)
			defer p.stop()
			evs := make([]vllm.Event, n)
			for i := range evs {
				evs[i] = vllm.Event{Type: vllm.BlockStored, BlockHashes: make([]vllm.BlockHash, 1), TokenIDs: make([]uint32, 16)}
			}
			batch := &vllm.Batch{Events: evs}
			b.ReportAllocs()
			for b.Loop() {
				if err := p.push("r00", 0, batch); err != nil {
					b.Fatal(err)
				}
			}
			if err := p.sync(); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/event")
		})
	}
}
