package group

import (
	"errors"
	"testing"

	"kvrouter/internal/kvindex"
	"kvrouter/internal/vllm"
	"kvrouter/internal/vllm/kvevents"
)

// TestBackendRestore: a snapshot taken at another block size rebuilds the
// index at that size; each engine's part enters the index when the engine
// resumes (once), with its marks as the subscriber's start; an engine the
// snapshot does not name, or one of another model, starts cold.
func TestBackendRestore(t *testing.T) {
	src, err := NewBackend(BackendConfig{Model: "m", Replicas: []string{"e0", "e1"}, Exact: true}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ev := vllm.Event{Type: vllm.BlockStored, BlockHashes: []vllm.BlockHash{5, 6}, TokenIDs: make([]uint32, 64), BlockSize: 32}
	src.Apply(kvevents.Update{Engine: "e0", Rank: 0, Seq: 9, Sum: 77, Batch: vllm.Batch{Events: []vllm.Event{ev}}})
	if src.BlockSize() != 32 {
		t.Fatalf("block size %d", src.BlockSize())
	}
	snap := src.Snapshot()

	b, err := NewBackend(BackendConfig{Model: "m", Replicas: []string{"e0", "e1"}, Exact: true}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Restore(snap); err != nil {
		t.Fatal(err)
	}
	if b.BlockSize() != 32 {
		t.Fatalf("restored at block size %d, want 32", b.BlockSize())
	}
	if got := b.Resume("e0"); got[0] != (kvevents.Position{Seq: 9, Sum: 77}) {
		t.Fatalf("resume e0: %v", got)
	}
	if got := b.Resume("e1"); got != nil {
		t.Fatalf("resume e1: %v", got)
	}
	if n := b.IndexStats().Entries; n != 2 {
		t.Fatalf("%d entries after resume, want 2", n)
	}
	other, _ := NewBackend(BackendConfig{Model: "other", Replicas: []string{"e0"}, Exact: true}, nil, nil, nil)
	if err := other.Restore(snap); !errors.Is(err, kvindex.ErrSnapshot) {
		t.Fatalf("foreign model: %v", err)
	}
	approx, _ := NewBackend(BackendConfig{Model: "m", Replicas: []string{"e0"}}, nil, nil, nil)
	if err := approx.Restore(snap); !errors.Is(err, kvindex.ErrSnapshot) || approx.Snapshot() != nil {
		t.Fatalf("approximate index: %v", err)
	}
}
