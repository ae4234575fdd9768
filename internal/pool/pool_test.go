package pool

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"kvrouter/internal/fleet"

	"kvrouter/internal/testwait"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// replicas records the routing side's calls.
type replicas struct {
	mu    sync.Mutex
	names []string
	log   []string
}

func (r *replicas) AddReplica(name string, _ int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.names = append(r.names, name)
	r.log = append(r.log, "+"+name)
}

func (r *replicas) RemoveReplica(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.names = slices.DeleteFunc(r.names, func(n string) bool { return n == name })
	r.log = append(r.log, "-"+name)
}

func (r *replicas) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := slices.Clone(r.names)
	slices.Sort(out)
	return out
}

// parts counts running parts per engine; a part runs until its ctx ends.
type parts struct {
	mu      sync.Mutex
	running map[string]int
	closed  map[string]int
}

func (p *parts) build(e Engine, _ *fleet.Endpoint) ([]Part, error) {
	if e.Events == "bad" {
		return nil, errors.New("bad events endpoint")
	}
	return []Part{{Name: "kv events",
		Run: func(ctx context.Context) error {
			p.mu.Lock()
			p.running[e.Name]++
			p.mu.Unlock()
			<-ctx.Done()
			p.mu.Lock()
			p.running[e.Name]--
			p.mu.Unlock()
			return ctx.Err()
		},
		Close: func() { p.mu.Lock(); p.closed[e.Name]++; p.mu.Unlock() },
	}}, nil
}

func (p *parts) state(name string) (running, closed int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.running[name], p.closed[name]
}

func testEngine(name string, routable bool) Engine {
	return Engine{Name: name, URL: "http://" + name + ":8000", Events: "tcp://" + name + ":5557", DPSize: 1, Routable: routable}
}

// The pool follows its source: scale 2 -> 4 -> 1, a not-ready engine, a
// changed address, a bad engine; parts of engines added before Run start
// with it; nothing of a removed engine is left running.
func TestSetFollowsSource(t *testing.T) {
	flt, err := fleet.New(fleet.Config{Models: []string{"m"}, ProbeInterval: -1, ScrapeInterval: -1, ModelsInterval: -1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	reps, pts := &replicas{}, &parts{running: map[string]int{}, closed: map[string]int{}}
	p, err := New(Deps{Model: "m", Fleet: flt, Replicas: reps, Parts: pts.build}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	healthy := func() []string {
		eps, _, _ := flt.Healthy(nil, "m")
		var out []string
		for _, e := range eps {
			out = append(out, e.Name())
		}
		slices.Sort(out)
		return out
	}
	if err := p.Set([]Engine{testEngine("e1", true), testEngine("e2", true)}); err != nil {
		t.Fatal(err)
	}
	if r, _ := pts.state("e1"); r != 0 {
		t.Fatal("a part ran before Run")
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	testwait.For(t, "parts of e1 and e2", func() bool { a, _ := pts.state("e1"); b, _ := pts.state("e2"); return a == 1 && b == 1 })

	four := []Engine{testEngine("e1", true), testEngine("e2", true), testEngine("e3", true), testEngine("e4", false)}
	if err := p.Set(four); err != nil {
		t.Fatal(err)
	}
	if got := healthy(); !slices.Equal(got, []string{"e1", "e2", "e3"}) {
		t.Fatalf("healthy at 4 (e4 not ready): %v", got)
	}
	if got := reps.list(); !slices.Equal(got, []string{"e1", "e2", "e3", "e4"}) {
		t.Fatalf("replicas at 4: %v", got)
	}
	testwait.For(t, "parts of e4", func() bool { r, _ := pts.state("e4"); return r == 1 })

	four[3].Routable = true
	if err := p.Set(four); err != nil {
		t.Fatal(err)
	}
	if got := healthy(); len(got) != 4 {
		t.Fatalf("e4 ready: healthy %v", got)
	}
	if r, c := pts.state("e4"); r != 1 || c != 0 {
		t.Fatalf("e4 becoming ready restarted its parts: running %d closed %d", r, c)
	}

	moved := testEngine("e1", true)
	moved.URL = "http://e1b:8000"
	if err := p.Set([]Engine{moved}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"e2", "e3", "e4"} {
		if r, c := pts.state(n); r != 0 || c != 1 {
			t.Fatalf("%s removed: running %d closed %d", n, r, c)
		}
	}
	if got := reps.list(); !slices.Equal(got, []string{"e1"}) || flt.Endpoint("e1").URL() != "http://e1b:8000" {
		t.Fatalf("after scaling to 1 with e1 moved: replicas %v", got)
	}
	testwait.For(t, "parts of the moved e1", func() bool { r, c := pts.state("e1"); return r == 1 && c == 1 })

	bad := testEngine("e5", true)
	bad.Events = "bad"
	if err := p.Set([]Engine{moved, bad}); err == nil {
		t.Fatal("an engine whose parts cannot be built: want error")
	}
	if flt.Endpoint("e5") != nil || !slices.Equal(reps.list(), []string{"e1"}) {
		t.Fatal("a failed add left an endpoint or replica behind")
	}
	if err := p.Set([]Engine{moved, moved}); err == nil || !slices.Equal(p.names(), []string{"e1"}) {
		t.Fatalf("duplicate names: err %v, names %v", err, p.names())
	}

	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
	if r, _ := pts.state("e1"); r != 0 {
		t.Fatal("a part still runs after Run returned")
	}
}

// A part that fails is logged and counted; the engine and the pool go on.
func TestPartFailureIsContained(t *testing.T) {
	flt, err := fleet.New(fleet.Config{Models: []string{"m"}, ProbeInterval: -1, ScrapeInterval: -1, ModelsInterval: -1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	calls := make(chan struct{}, 2)
	p, err := New(Deps{Model: "m", Fleet: flt, Replicas: &replicas{}, Parts: func(Engine, *fleet.Endpoint) ([]Part, error) {
		return []Part{{Name: "probe", Run: func(context.Context) error { calls <- struct{}{}; panic("boom") }}}, nil
	}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	if err := p.Set([]Engine{testEngine("e1", true)}); err != nil {
		t.Fatal(err)
	}
	<-calls
	testwait.For(t, "the failure counted", func() bool { return counterValue(p.m.partFailures.WithLabelValues("probe")) == 1 })
	if flt.Endpoint("e1") == nil {
		t.Fatal("the engine left with its part")
	}
	cancel()
	<-done
}

func counterValue(c interface{ Write(*dto.Metric) error }) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// A changed API key is swapped on the live endpoint: the engine is not
// removed and added again (its replica, index entries and parts stay).
func TestSetRotatesAPIKey(t *testing.T) {
	flt, err := fleet.New(fleet.Config{Models: []string{"m"}, ProbeInterval: -1, ScrapeInterval: -1, ModelsInterval: -1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	reps := &replicas{}
	p, err := New(Deps{Model: "m", Fleet: flt, Replicas: reps}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := testEngine("e1", true)
	e.APIKey = "old"
	if err := p.Set([]Engine{e}); err != nil {
		t.Fatal(err)
	}
	ep := flt.Endpoint("e1")
	e.APIKey = "new"
	if err := p.Set([]Engine{e}); err != nil {
		t.Fatal(err)
	}
	if got := flt.Endpoint("e1"); got != ep || got.APIKey() != "new" {
		t.Fatalf("endpoint %p key %q, want the same %p with key new", got, got.APIKey(), ep)
	}
	if !slices.Equal(reps.log, []string{"+e1"}) {
		t.Errorf("replica calls %v: the engine was re-added", reps.log)
	}
}
