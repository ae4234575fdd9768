package group

import (
	"testing"

	"kvrouter/internal/vllm/kvevents"
)

// Engines added and removed while the group serves: a removed engine's
// entries go and a late update of it is ignored (no zombie replica); an
// added one starts cold and is routed to; another engine's entries are
// untouched.
func TestBackendAddRemoveReplica(t *testing.T) {
	b := newTestBackend(t, "kv")
	prompt := seq(640)
	b.Apply(stored(prompt, 16)) // engine b holds the prompt
	route := func() Decision {
		t.Helper()
		d, err := b.Route(&RouteInput{Tokens: prompt, Candidates: []string{"a", "b", "c"}, DryRun: true})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := route(); d.Replica != "b" || d.CachedTokens == 0 {
		t.Fatalf("before changes: %+v", d)
	}
	entries := b.IndexStats().Entries

	b.AddReplica("c", 1)
	b.AddReplica("c", 1) // idempotent
	if d := route(); d.Replica != "b" {
		t.Fatalf("after adding c: routed to %s", d.Replica)
	}
	if got := b.IndexStats().Entries; got != entries {
		t.Fatalf("adding c changed the index: %d entries, want %d", got, entries)
	}

	b.RemoveReplica("b")
	if got := b.IndexStats().Entries; got != 0 {
		t.Fatalf("b removed: %d entries left", got)
	}
	b.Apply(stored(prompt, 16)) // a late batch of b's subscriber
	b.Apply(kvevents.Update{Engine: "b", Reset: kvevents.ResetRestart})
	if got := b.IndexStats().Entries; got != 0 {
		t.Fatalf("a late update re-created b: %d entries", got)
	}
	if d := route(); d.Replica == "b" || d.CachedTokens != 0 {
		t.Fatalf("after removing b: %+v", d)
	}
	b.AddReplica("b", 1) // the same name again starts cold
	if d := route(); d.CachedTokens != 0 {
		t.Fatalf("b re-added: cached %d, want cold", d.CachedTokens)
	}
}
