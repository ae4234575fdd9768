package k8stest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// KubeVersion is the kube-apiserver version tools/k8s-testenv/setup.sh
// builds and Start looks for.
const KubeVersion = "v1.37.2"

// RequiredEnv names the variable that turns a skip for a missing binary or
// missing root into a failure (CI sets it to 1).
const RequiredEnv = "KVROUTER_K8S_REQUIRED"

// unavailable skips t with one line saying what is missing, or fails it
// when RequiredEnv is 1.
func unavailable(t testing.TB, what, fix string) {
	t.Helper()
	if os.Getenv(RequiredEnv) == "1" {
		t.Fatalf("k8stest: %s (%s=1)", what, RequiredEnv)
	}
	t.Skipf("k8stest: skipped: %s (%s; %s=1 makes this fail)", what, fix, RequiredEnv)
}

// Fixes named in skip messages.
const (
	fixBinaries = "make k8s-testenv installs them, as root"
	fixRoot     = "run the tests as root"
)

// binaries are the control plane's programs.
type binaries struct {
	etcd      string
	apiserver string
}

// cacheDir is where setup.sh caches kube-apiserver builds.
func cacheDir() (string, error) {
	if d := os.Getenv("KVROUTER_K8S_CACHE"); d != "" {
		return d, nil
	}
	d, err := os.UserCacheDir() // $XDG_CACHE_HOME, else $HOME/.cache
	if err != nil {
		return "", err
	}
	return filepath.Join(d, "kvrouter", "k8s"), nil
}

// findBinaries locates etcd and kube-apiserver; the error names what is
// missing.
func findBinaries() (binaries, error) {
	var b binaries
	var errs []error
	if p := os.Getenv("KVROUTER_ETCD"); p != "" {
		b.etcd = p
	} else if p, err := exec.LookPath("etcd"); err == nil {
		b.etcd = p
	} else {
		errs = append(errs, errors.New("etcd not on PATH"))
	}
	if p := os.Getenv("KVROUTER_KUBE_APISERVER"); p != "" {
		b.apiserver = p
	} else if d, err := cacheDir(); err != nil {
		errs = append(errs, fmt.Errorf("no cache directory for kube-apiserver: %w", err))
	} else {
		b.apiserver = filepath.Join(d, KubeVersion, "kube-apiserver")
	}
	if b.apiserver != "" {
		if fi, err := os.Stat(b.apiserver); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			errs = append(errs, fmt.Errorf("no kube-apiserver %s at %s", KubeVersion, b.apiserver))
		}
	}
	return b, errors.Join(errs...)
}

// requireRoot skips or fails t unless the process is root and has ip(8);
// it always skips under -short.
func requireRoot(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: needs root for network namespaces")
	}
	if os.Geteuid() != 0 {
		unavailable(t, "network namespaces need root", fixRoot)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		unavailable(t, "network namespaces need ip(8) (Debian iproute2)", "apt-get install iproute2")
	}
}

// Helm returns the helm binary set-up builds (KVROUTER_HELM), else helm on
// PATH; without one it skips t, or fails it when RequiredEnv is 1.
func Helm(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("KVROUTER_HELM"); p != "" {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("helm"); err == nil {
		return p
	}
	unavailable(t, "helm not found (KVROUTER_HELM or PATH)", "make setup-test builds it")
	return ""
}
