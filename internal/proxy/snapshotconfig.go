package proxy

import "time"

// SnapshotConfig configures snapshots of the exact index (router.yaml
// "snapshot"): written on shutdown and every Interval, read on start.
type SnapshotConfig struct {
	// Path is the snapshot file ("" : no snapshots). It is written by a
	// temporary file in the same directory renamed over it, so a reader
	// finds the old file or the new one, never a part.
	Path string `yaml:"path"`
	// Interval between periodic snapshots while serving (default 5m;
	// negative: only on shutdown).
	Interval time.Duration `yaml:"interval"`
}

// DefaultSnapshotInterval is SnapshotConfig.Interval's default.
const DefaultSnapshotInterval = 5 * time.Minute

func (c *SnapshotConfig) fillDefaults() {
	if c.Interval == 0 {
		c.Interval = DefaultSnapshotInterval
	}
}
