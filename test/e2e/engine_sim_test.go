package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// simProc is kvrouter engine-sim running as a process.
type simProc struct {
	logs   *lockedBuffer
	addr   string // HTTP host:port from the "serving" line
	cancel context.CancelFunc
	done   chan error
}

// startEngineSim runs the command with args (plus a fast loopback setup)
// and waits for its "engine-sim serving" line; stop it with stop.
func startEngineSim(t *testing.T, args ...string) *simProc {
	t.Helper()
	if _, err := kvrouterBin(); err != nil { // before the wait for the serving line
		t.Fatal(err)
	}
	p := &simProc{logs: &lockedBuffer{}, done: make(chan error, 1)}
	var ctx context.Context
	ctx, p.cancel = context.WithCancel(context.Background())
	args = append([]string{"--host", "127.0.0.1", "--port", "0", "--profile", "fast",
		"--num-gpu-blocks-override", "1024", "--max-model-len", "4096"}, args...)
	go func() { p.done <- runEngineSim(ctx, args, stdio{out: io.Discard, err: p.logs}) }()
	re := regexp.MustCompile(`engine-sim serving"? addr=(127\.0\.0\.1:\d+)`)
	for range 500 {
		if m := re.FindStringSubmatch(p.logs.String()); m != nil {
			p.addr = m[1]
			return p
		}
		select {
		case err := <-p.done:
			t.Fatalf("engine-sim stopped: %v; logs: %s", err, p.logs.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	p.cancel()
	t.Fatalf("no serving line in logs: %s", p.logs.String())
	return nil
}

// complete posts a small completion and checks it succeeded.
func (p *simProc) complete(t *testing.T, prompt string) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 2})
	resp, err := http.Post("http://"+p.addr+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"completion_tokens":2`) {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
}

func (p *simProc) stop(t *testing.T) {
	t.Helper()
	p.cancel()
	if err := <-p.done; err != nil {
		t.Fatal(err)
	}
}

// TestEngineSimRun starts the command as a process on a loopback port and
// stops it with ctx.
func TestEngineSimRun(t *testing.T) {
	p := startEngineSim(t)
	p.complete(t, "hi")
	p.stop(t)
}

// subscribeUntilBatch dials a SUB to the PUB at addr and sends completions
// until a KV event batch arrives.
func subscribeUntilBatch(t *testing.T, p *simProc, addr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	if err := sub.Dial(addr); err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	got := make(chan error, 1)
	go func() { _, err := sub.Recv(); got <- err }()
	for i := range 200 {
		p.complete(t, fmt.Sprintf("request %03d %s", i, strings.Repeat("k", 40)))
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatal("no KV event batch received")
}

// TestEngineSimKVEventsBind: --kv-events-bind makes the PUB listen on a
// host address (loopback only) instead of connecting to it, as vLLM would.
func TestEngineSimKVEventsBind(t *testing.T) {
	kv := `{"enable_kv_cache_events":true,"endpoint":"tcp://127.0.0.1:0","replay_endpoint":"tcp://127.0.0.1:0"}`
	p := startEngineSim(t, "--kv-events-config", kv, "--kv-events-bind")
	m := regexp.MustCompile(`kv_events=(tcp://127\.0\.0\.1:\d+) kv_replay=tcp://127\.0\.0\.1:\d+`).FindStringSubmatch(p.logs.String())
	if m == nil {
		p.cancel()
		t.Fatalf("no bound loopback kv_events in logs: %s", p.logs.String())
	}
	subscribeUntilBatch(t, p, m[1])
	p.stop(t)
}

// TestEngineSimIPCRelaunch: relaunching with the ipc endpoints of a killed
// engine (socket files left, nobody listening) works; an endpoint another
// engine listens on fails with "address already in use" and no "serving"
// line.
func TestEngineSimIPCRelaunch(t *testing.T) {
	dir, err := os.MkdirTemp("", "es") // short: unix socket names are <= 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	pub, replay := filepath.Join(dir, "pub"), filepath.Join(dir, "replay")
	for _, path := range []string{pub, replay} { // what SIGKILL leaves behind
		ln, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		ln.(*net.UnixListener).SetUnlinkOnClose(false)
		ln.Close()
	}
	kv := fmt.Sprintf(`{"enable_kv_cache_events":true,"endpoint":"ipc://%s","replay_endpoint":"ipc://%s"}`, pub, replay)
	p := startEngineSim(t, "--kv-events-config", kv)
	subscribeUntilBatch(t, p, "ipc://"+pub)

	// A second engine on the same endpoints while the first runs.
	var logs lockedBuffer
	err = runEngineSim(context.Background(), []string{"--host", "127.0.0.1", "--port", "0", "--profile", "fast",
		"--num-gpu-blocks-override", "1024", "--max-model-len", "4096", "--kv-events-config", kv}, stdio{out: io.Discard, err: &logs})
	if err == nil || !strings.Contains(err.Error(), "address already in use") || strings.Contains(logs.String(), "serving") {
		t.Fatalf("second engine: %v; logs: %s", err, logs.String())
	}
	subscribeUntilBatch(t, p, "ipc://"+pub) // the first one is unharmed
	p.stop(t)
}

// runEngineSim runs kvrouter engine-sim with args as a process until it
// exits (ctx ending interrupts it): nil for exit code 0, else an error
// with the command's error line.
func runEngineSim(ctx context.Context, args []string, sio stdio) error {
	return runErr(ctx, append([]string{"engine-sim"}, args...), sio)
}
