package serve

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"kvrouter/internal/config"
	"kvrouter/internal/group"
	"kvrouter/internal/kvindex"
)

// readSnapshot reads the snapshot file at path (router.yaml snapshot.path)
// by model. A missing file, or one that cannot be used (not a snapshot,
// another version, truncated, corrupt), is one log line and no snapshot:
// the router starts cold.
func readSnapshot(path string, log *slog.Logger) map[string]*kvindex.Snapshot {
	if path == "" {
		return nil
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		log.Info("no index snapshot yet, starting cold", "path", path)
		return nil
	}
	var snaps []*kvindex.Snapshot
	if err == nil {
		snaps, err = kvindex.DecodeSnapshots(data)
	}
	if err != nil {
		log.Warn("index snapshot rejected, starting cold", "path", path, "err", err)
		return nil
	}
	out := make(map[string]*kvindex.Snapshot, len(snaps))
	for _, s := range snaps {
		out[s.Model] = s
	}
	return out
}

// restoreSnapshot hands a model's part of the snapshot to its backend
// before the group's engines are added; a part the backend refuses
// (another pool, a group without KV events) is one log line and that
// group starts cold.
func restoreSnapshot(snaps map[string]*kvindex.Snapshot, model string, b *group.Backend, log *slog.Logger) {
	s := snaps[model]
	if s == nil {
		return
	}
	delete(snaps, model)
	if err := b.Restore(s); err != nil {
		log.Warn("index snapshot rejected for model, starting it cold", "model", model, "err", err)
		return
	}
	log.Info("index snapshot loaded", "model", model, "engines", len(s.Engines), "entries", s.Entries())
}

// writeSnapshot writes every exact index's snapshot to path atomically: a
// temporary file in path's directory, synced, renamed over path, and the
// directory synced.
func writeSnapshot(path string, backends map[string]*group.Backend) (int, error) {
	var snaps []*kvindex.Snapshot
	entries := 0
	for _, m := range slices.Sorted(maps.Keys(backends)) {
		if s := backends[m].Snapshot(); s != nil {
			snaps = append(snaps, s)
			entries += s.Entries()
		}
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, filepath.Base(path)+".tmp*")
	if err != nil {
		return 0, err
	}
	tmp := f.Name()
	err = kvindex.EncodeSnapshots(f, snaps)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return 0, fmt.Errorf("index snapshot %s: %w", path, err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return entries, nil
}

// snapshotLoop writes a snapshot every interval until ctx ends (interval
// <= 0: never); a failed write is logged and retried at the next tick.
func snapshotLoop(ctx context.Context, cfg config.Snapshot, backends map[string]*group.Backend, log *slog.Logger) error {
	if cfg.Path == "" || cfg.Interval <= 0 {
		return nil
	}
	t := time.NewTicker(cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			start := time.Now()
			n, err := writeSnapshot(cfg.Path, backends)
			if err != nil {
				log.Warn("periodic index snapshot failed", "err", err)
				continue
			}
			log.Debug("index snapshot written", "path", cfg.Path, "entries", n, "ms", time.Since(start).Milliseconds())
		}
	}
}
