// Package e2e holds kvrouter's system and end-to-end tests: engine-sims,
// routers and endpoint pickers on loopback (HTTP, gRPC and ZeroMQ), the
// kvrouter binary run as a process, the openai npm client, HAProxy, helm
// charts against a kube-apiserver, Prometheus rules and the /ui page in
// Chromium. Tests that need a part set-up installs skip without it (or
// fail under KVROUTER_K8S_REQUIRED / KVROUTER_TOOLS_REQUIRED); under
// -short (make check) every test that starts engines or routers skips.
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// kvbin is the kvrouter binary the tests run as a process, built once
// per test binary into a temporary directory TestMain removes.
var kvbin struct {
	dir  string // the temporary directory
	pkg  string // this package's directory: tests may chdir before the build
	once sync.Once
	path string
	err  error
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kvrouter-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	kvbin.dir = dir
	if kvbin.pkg, err = os.Getwd(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// kvrouterBin builds ../../cmd/kvrouter on first use and returns the
// binary's path, or the build's error with its output.
func kvrouterBin() (string, error) {
	kvbin.once.Do(func() {
		bin := filepath.Join(kvbin.dir, "kvrouter")
		cmd := exec.Command("go", "build", "-o", bin, "../../cmd/kvrouter")
		cmd.Dir = kvbin.pkg
		out, err := cmd.CombinedOutput()
		if err != nil {
			kvbin.err = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		kvbin.path = bin
	})
	return kvbin.path, kvbin.err
}

// stdio is what a kvrouter process reads and writes.
type stdio struct {
	in       io.Reader
	out, err io.Writer
}

// run runs the kvrouter binary with args until it exits and returns its
// exit code; ctx ending interrupts it (SIGINT, as a terminal's ^C), which
// the command takes as its signal to stop. A binary that cannot be built
// or started is exit code 1 with the reason on sio.err.
func run(ctx context.Context, args []string, sio stdio) int {
	bin, err := kvrouterBin()
	if err == nil {
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
		cmd.Stdin, cmd.Stdout, cmd.Stderr = sio.in, sio.out, sio.err
		err = cmd.Run()
		// After an interrupt, Run reports ctx's error even when the
		// process exited 0: the exit status is the answer.
		if st := cmd.ProcessState; st != nil && st.Exited() {
			return st.ExitCode()
		}
	}
	if sio.err != nil {
		fmt.Fprintln(sio.err, err)
	}
	return 1
}

// runErr is run returning nil for exit code 0, else an error naming the
// exit code and the last line the process wrote to stderr (the command's
// error).
func runErr(ctx context.Context, args []string, sio stdio) error {
	var errb bytes.Buffer
	w := io.Writer(&errb)
	if sio.err != nil {
		w = io.MultiWriter(sio.err, &errb)
	}
	code := run(ctx, args, stdio{in: sio.in, out: sio.out, err: w})
	if code == 0 {
		return nil
	}
	lines := strings.Split(strings.TrimSpace(errb.String()), "\n")
	return fmt.Errorf("exit %d: %s", code, lines[len(lines)-1])
}

// runCmd runs kvrouter and returns its exit code, stdout and stderr.
func runCmd(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, stdio{strings.NewReader(""), &out, &errb})
	return code, out.String(), errb.String()
}

// lockedBuffer is a bytes.Buffer safe for a process's output and a test
// reading it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
