package kvindex

import (
	"context"
	"log/slog"
	"sync"
	"testing"

	"kvrouter/internal/vllm"
)

// warnRecorder keeps the Warn records a logger receives, with their
// attributes (those added by With included).
type warnRecorder struct {
	mu    *sync.Mutex
	recs  *[]map[string]string
	attrs []slog.Attr
}

func newWarnRecorder() *warnRecorder {
	return &warnRecorder{mu: &sync.Mutex{}, recs: &[]map[string]string{}}
}

func (w *warnRecorder) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (w *warnRecorder) Handle(_ context.Context, r slog.Record) error {
	m := map[string]string{"msg": r.Message}
	for _, a := range w.attrs {
		m[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
	w.mu.Lock()
	defer w.mu.Unlock()
	*w.recs = append(*w.recs, m)
	return nil
}

func (w *warnRecorder) WithAttrs(as []slog.Attr) slog.Handler {
	return &warnRecorder{mu: w.mu, recs: w.recs, attrs: append(append([]slog.Attr{}, w.attrs...), as...)}
}

func (w *warnRecorder) WithGroup(string) slog.Handler { return w }

func (w *warnRecorder) records() []map[string]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]map[string]string{}, *w.recs...)
}

// TestUnknownParentWarnsOncePerEngine: an engine whose BlockStored events
// all name parents it never stored is warned about once, with the count,
// when 100 were skipped; more of them add nothing to the log, only to the
// counter. An engine with a few unknown parents among many applied stores
// (a reset mid-request) is not warned about; a third engine gets its own
// warning.
func TestUnknownParentWarnsOncePerEngine(t *testing.T) {
	rec := newWarnRecorder()
	x, err := NewExact(Config{Model: "m", BlockSize: 4}, slog.New(rec), nil)
	if err != nil {
		t.Fatal(err)
	}
	orphans := func(engine string, n int) {
		for i := range n {
			x.Apply(engine, batch(0, storedEv(hp(uint64(1000+i)), []uint64{uint64(5000 + i)}, abcd[4:8], "")))
		}
	}
	orphans("a", 250)
	for i := range 300 { // b: 300 chains applied, then 150 orphans
		x.Apply("b", batch(0, storedEv(nil, []uint64{uint64(9000 + i)}, seq(16*i, 4), "")))
	}
	orphans("b", 150)
	orphans("c", 100)
	recs := rec.records()
	if len(recs) != 2 {
		t.Fatalf("%d warnings, want 2 (engines a and c): %v", len(recs), recs)
	}
	for i, eng := range []string{"a", "c"} {
		r := recs[i]
		if r["engine"] != eng || r["unknown_parent_events"] != "100" || r["applied_events"] != "0" ||
			r["rank"] != "0" || r["model"] != "m" {
			t.Fatalf("warning %d: %v, want engine %s with 100 unknown-parent events", i, r, eng)
		}
	}
	if s := x.Stats(); s.UnknownParent != 500 || s.Entries != 300 {
		t.Fatalf("UnknownParent %d Entries %d, want 500 and 300", s.UnknownParent, s.Entries)
	}
	// A replica removed and registered again is a new engine: warned anew.
	x.RemoveReplica("a")
	orphans("a", 100)
	if n := len(rec.records()); n != 3 {
		t.Fatalf("%d warnings after a re-registered, want 3", n)
	}
}

// TestPositionalParentZeroIndexed: llm-d-inference-sim's default events,
// positional layout with parent_block_hash 0 for a chain's first block,
// decode to chains the index holds (before, every event was skipped as an
// unknown parent and the index stayed empty).
func TestPositionalParentZeroIndexed(t *testing.T) {
	zero := vllm.BlockHash(0)
	b := vllm.Batch{TS: 1, Events: []vllm.Event{
		{Type: vllm.BlockStored, BlockHashes: []vllm.BlockHash{1, 2}, ParentBlockHash: &zero, TokenIDs: abcd[:8], BlockSize: 4, Medium: "GPU"},
		{Type: vllm.BlockStored, BlockHashes: []vllm.BlockHash{3, 4}, ParentBlockHash: hp(2), TokenIDs: abcd[8:], BlockSize: 4, Medium: "GPU"},
	}}
	payload, err := vllm.AppendBatch(nil, &b, vllm.LayoutArray)
	if err != nil {
		t.Fatal(err)
	}
	got, err := vllm.DecodeBatch(payload)
	if err != nil {
		t.Fatal(err)
	}
	x := testExact(newClock(), nil)
	x.Apply("sim", &got)
	if m := lookupOf(x, "sim", abcd, Extras{}); m.GPU != 4 {
		t.Fatalf("match %+v, want 4 GPU blocks", m)
	}
	if s := x.Stats(); s.UnknownParent != 0 || s.Entries != 4 {
		t.Fatalf("UnknownParent %d Entries %d", s.UnknownParent, s.Entries)
	}
}
