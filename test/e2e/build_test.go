package e2e

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The Dockerfile's build command makes a static binary (no ELF interpreter,
// so it runs on a distroless base without libc) whose version is the
// VERSION build argument.
func TestDockerfileBuildStatic(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds the binary")
	}
	df, err := os.ReadFile(filepath.Join("..", "..", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var build string
	for _, l := range strings.Split(string(df), "\n") {
		if strings.HasPrefix(l, "RUN go build ") {
			build = strings.TrimPrefix(l, "RUN ")
		}
	}
	if build == "" || !strings.Contains(string(df), "CGO_ENABLED=0") {
		t.Fatalf("Dockerfile has no `RUN go build` line with CGO_ENABLED=0")
	}
	bin := filepath.Join(t.TempDir(), "kvrouter")
	build = strings.ReplaceAll(build, "${VERSION}", "v9.9.9-test")
	build = strings.ReplaceAll(build, "/out/kvrouter", bin)
	cmd := exec.CommandContext(t.Context(), "sh", "-c", build)
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", build, err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatalf("%s is dynamically linked (has PT_INTERP)", bin)
		}
	}
	out, err := exec.CommandContext(t.Context(), bin, "version").Output()
	if err != nil || !strings.HasPrefix(string(out), "kvrouter v9.9.9-test ") {
		t.Fatalf("version: %q, %v", out, err)
	}
}

// `make build` stamps the chart's appVersion, so its binary names a version
// even when built without VCS information (GOFLAGS=-buildvcs=false prints
// "(devel)" otherwise): the Makefile's build command, run with another
// output path, gives a binary whose version is Chart.yaml's appVersion.
func TestMakeBuildVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds the binary")
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	root := filepath.Join("..", "..")
	chart, err := os.ReadFile(filepath.Join(root, "deploy", "helm", "kvrouter", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var app string
	for _, l := range strings.Split(string(chart), "\n") {
		if v, ok := strings.CutPrefix(l, "appVersion:"); ok {
			app = strings.Trim(strings.TrimSpace(v), `"`)
		}
	}
	if app == "" {
		t.Fatal("Chart.yaml has no appVersion")
	}
	// make -n prints the command without running it; the environment's
	// VERSION and a parent make's flags are left out.
	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "VERSION" && k != "MAKEFLAGS" && k != "MAKELEVEL" && k != "MFLAGS" {
			env = append(env, kv)
		}
	}
	mk := exec.CommandContext(t.Context(), "make", "-n", "-s", "build", "GO=go")
	mk.Dir, mk.Env = root, env
	out, err := mk.Output()
	if err != nil {
		t.Fatalf("make -n build: %v\n%s", err, out)
	}
	build := strings.TrimSpace(string(out))
	if !strings.Contains(build, `-X main.buildVersionOverride=`+app+`"`) || !strings.Contains(build, "-o bin/kvrouter ") {
		t.Fatalf("make build runs %q, want -X main.buildVersionOverride=%s and -o bin/kvrouter", build, app)
	}
	bin := filepath.Join(t.TempDir(), "kvrouter")
	cmd := exec.CommandContext(t.Context(), "sh", "-c", strings.Replace(build, "-o bin/kvrouter ", "-o "+bin+" ", 1))
	cmd.Dir, cmd.Env = root, append(env, "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", build, err, out)
	}
	v, err := exec.CommandContext(t.Context(), bin, "version").Output()
	if err != nil || !strings.HasPrefix(string(v), "kvrouter "+app+" ") {
		t.Fatalf("version: %q, %v; want kvrouter %s ...", v, err, app)
	}
}
