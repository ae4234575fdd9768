package serve

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kvrouter/internal/group"
	"kvrouter/internal/kvindex"
	"kvrouter/internal/vllm"
	"kvrouter/internal/vllm/kvevents"
)

func snapBackend(t *testing.T, model string) *group.Backend {
	t.Helper()
	b, err := group.NewBackend(group.BackendConfig{Model: model, Replicas: []string{"e0"}, Exact: true}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSnapshotFileRejected: a snapshot written by writeSnapshot is read
// back and resumes the engine from its mark; a truncated or corrupt file,
// or one of another model, is one warning and a cold start; no temporary
// file is left beside the snapshot.
func TestSnapshotFileRejected(t *testing.T) {
	b := snapBackend(t, "m")
	ev := vllm.Event{Type: vllm.BlockStored, BlockHashes: []vllm.BlockHash{7}, TokenIDs: make([]uint32, 16), BlockSize: 16}
	b.Apply(kvevents.Update{Engine: "e0", Seq: 41, Sum: 99, Batch: vllm.Batch{Events: []vllm.Event{ev}}})
	path := filepath.Join(t.TempDir(), "index.snap")
	if n, err := writeSnapshot(path, map[string]*group.Backend{"m": b}); err != nil || n != 1 {
		t.Fatalf("write: %d entries, %v", n, err)
	}
	if ents, _ := os.ReadDir(filepath.Dir(path)); len(ents) != 1 {
		t.Fatalf("%d files beside the snapshot", len(ents)-1)
	}
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	snaps := readSnapshot(path, log)
	taken := snaps["m"]
	fresh := snapBackend(t, "m")
	restoreSnapshot(snaps, "m", fresh, log)
	if got := fresh.Resume("e0"); got[0] != (kvevents.Position{Seq: 41, Sum: 99}) {
		t.Fatalf("resume %v", got)
	}

	good, _ := os.ReadFile(path)
	for name, data := range map[string][]byte{
		"truncated": good[:len(good)-5],
		"corrupt":   append(bytes.Clone(good[:30]), append([]byte{good[30] ^ 1}, good[31:]...)...),
		"empty":     nil,
	} {
		logs.Reset()
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if s := readSnapshot(path, log); s != nil {
			t.Fatalf("%s: accepted", name)
		}
		if n := strings.Count(logs.String(), "\n"); n != 1 || !strings.Contains(logs.String(), "index snapshot rejected") {
			t.Fatalf("%s: logged %q, want one line", name, logs.String())
		}
	}
	logs.Reset()
	other := snapBackend(t, "other")
	snaps = map[string]*kvindex.Snapshot{"other": taken}
	restoreSnapshot(snaps, "other", other, log)
	if n := strings.Count(logs.String(), "\n"); n != 1 || other.Resume("e0") != nil {
		t.Fatalf("foreign model: logged %q, resume %v", logs.String(), other.Resume("e0"))
	}
}
