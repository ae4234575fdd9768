package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"kvrouter/internal/k8stest"
)

// manifestsDir holds the plain manifests `make manifests` renders.
const manifestsDir = "../../deploy/manifests"

// TestManifests renders the plain manifests from the chart (as `make
// manifests` does, with tools/manifests/render.sh) into a temporary
// directory and fails when deploy/manifests differs: a chart change must
// come with `make manifests`.
func TestManifests(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs helm")
	}
	helm := k8stest.Helm(t)
	dir := t.TempDir()
	cmd := exec.CommandContext(t.Context(), "../../tools/manifests/render.sh", dir)
	cmd.Env = append(os.Environ(), "KVROUTER_HELM="+helm)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("render.sh: %v\n%s", err, out)
	}
	fresh, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	committed, _ := filepath.Glob(filepath.Join(manifestsDir, "*.yaml"))
	if len(fresh) == 0 || len(fresh) != len(committed) {
		t.Fatalf("rendered %d manifests, %d committed in deploy/manifests: run make manifests", len(fresh), len(committed))
	}
	for _, f := range fresh {
		want, _ := os.ReadFile(f)
		got, err := os.ReadFile(filepath.Join(manifestsDir, filepath.Base(f)))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("deploy/manifests/%s differs from what the chart renders (run make manifests): %v", filepath.Base(f), err)
		}
	}
}
