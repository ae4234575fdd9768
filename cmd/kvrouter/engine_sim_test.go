package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"kvrouter/internal/enginesim"
)

// lockedBuffer is a bytes.Buffer safe for a logger and a test reading it.
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

// TestEngineSimHelp: --help documents every flag, and each has usage text.
func TestEngineSimHelp(t *testing.T) {
	var out bytes.Buffer
	_, err := parseEngineSimFlags([]string{"--help"}, func(string) string { return "" }, stdio{err: &out})
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	for _, name := range []string{
		"host", "port", "served-model-name", "block-size", "num-gpu-blocks-override", "num-cpu-blocks",
		"max-num-seqs", "max-num-batched-tokens", "max-model-len", "kv-events-config", "prefix-caching-hash-algo",
		"tokenizer", "lora-modules", "legacy-events", "profile", "fault-error-rate", "fault-drop-every-k-batches",
		"fault-slow-start", "fault-hang-rate", "fault-die-rate", "fault-spike-rate", "data-parallel-rank",
		"kv-events-bind", "kv-events-buffer-bytes", "kv-events-queue-bytes",
	} {
		if !strings.Contains(out.String(), "  -"+name+" ") && !strings.Contains(out.String(), "  -"+name+"\n") {
			t.Errorf("--help lacks -%s", name)
		}
	}
	if !strings.Contains(out.String(), "PYTHONHASHSEED") {
		t.Error("--help does not mention PYTHONHASHSEED")
	}
}

func TestEngineSimFlags(t *testing.T) {
	env := map[string]string{"PYTHONHASHSEED": "0"}
	fl, err := parseEngineSimFlags([]string{
		"--host", "127.0.0.1", "--port", "0", "--served-model-name", "m", "--block-size", "32",
		"--num-gpu-blocks-override", "5000", "--max-model-len", "8192", "--max-num-seqs", "64",
		"--kv-events-config", `{"enable_kv_cache_events":true,"endpoint":"tcp://*:5557","topic":"t"}`,
		"--prefix-caching-hash-algo", "sha256_cbor", "--lora-modules", "ad=/path", "--enable-prompt-tokens-details=false",
		"--kv-events-buffer-bytes", "1048576", "--shutdown-timeout", "30",
	}, func(k string) string { return env[k] }, stdio{err: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	c := fl.cfg
	if c.Addr != "127.0.0.1:0" || c.ServedModelName != "m" || c.Core.BlockSize != 32 || c.Core.NumGPUBlocks != 5000 ||
		c.Core.MaxModelLen != 8192 || c.Core.MaxNumSeqs != 64 || !c.KVEvents.EnableKVCacheEvents || c.KVEvents.Topic != "t" ||
		c.HashAlgo != "sha256_cbor" || len(c.LoRAModules) != 1 || c.LoRAModules[0] != "ad" || !c.NoPromptTokensDetails ||
		c.KVEvents.BufferBytes != 1<<20 || c.KVEvents.QueueBytes != enginesim.DefaultQueueBytes || c.ShutdownTimeout != 30*time.Second {
		t.Fatalf("config %+v", c)
	}
	// PYTHONHASHSEED=0 makes the hasher vLLM's seeded one: NONE_HASH of "0".
	h, err := c.NewHasher()
	if err != nil {
		t.Fatal(err)
	}
	a, b := h.HashBlock(nil, []uint32{1, 2}, nil), h.HashBlock(nil, []uint32{1, 2}, nil)
	if !bytes.Equal(a, b) || len(a) != 32 {
		t.Fatalf("seeded sha256_cbor hasher: %x %x", a, b)
	}
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"--prefix-caching-hash-algo", "md5"}, `"md5": want sha256, sha256_cbor, xxhash, xxhash_cbor or fast`},
		{[]string{"--kv-events-config", `{"nope":1}`}, ""},
		{[]string{"--port", "x"}, ""},
		{[]string{"--port", "-5"}, "--port -5: want 0..65535"},
		{[]string{"--port", "65536"}, "--port 65536"},
		{[]string{"--shutdown-timeout", "-1"}, "--shutdown-timeout -1: want seconds >= 0"},
		{[]string{"--kv-events-buffer-bytes", "0"}, "--kv-events-buffer-bytes 0"},
		{[]string{"--kv-events-queue-bytes", "-1"}, "--kv-events-queue-bytes -1"},
		{[]string{"extra"}, ""},
	} {
		_, err := parseEngineSimFlags(bad.args, func(string) string { return "" }, stdio{err: io.Discard})
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: %v, want a usage error with %q", bad.args, err, bad.want)
		}
	}
	// Through run(), as main: usage errors exit 2.
	var errb bytes.Buffer
	if code := run(context.Background(), []string{"engine-sim", "--port", "-5"}, stdio{out: io.Discard, err: &errb}); code != 2 {
		t.Errorf("--port -5: exit %d, want 2 (%s)", code, errb.String())
	}
}

// simProc is runEngineSim running in-process.
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

// TestEngineSimRun starts the command in-process on a loopback port and
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
	for _, bind := range []bool{false, true} {
		args := []string{"--kv-events-config", kv}
		if bind {
			args = append(args, "--kv-events-bind")
		}
		fl, err := parseEngineSimFlags(args, func(string) string { return "" }, stdio{err: io.Discard})
		if err != nil || fl.cfg.KVEvents.Bind != bind {
			t.Fatalf("%q: bind %v, %v", args, fl.cfg.KVEvents.Bind, err)
		}
	}
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

// TestEngineSimTokenizer: --tokenizer plugs the real tokenizer and chat
// template in; a golden chat gives the golden ids.
func TestEngineSimTokenizer(t *testing.T) {
	fl, err := parseEngineSimFlags([]string{"--tokenizer", "../../testdata/tokenizer/qwen3"}, func(string) string { return "" }, stdio{err: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	ids, err := fl.cfg.Tokenizer.EncodeChat([]byte(`{"messages":[{"role":"user","content":"Hello!"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	want := []uint32{151644, 872, 198, 9707, 0, 151645, 198, 151644, 77091, 198} // testdata/tokenizer/qwen3/chat.jsonl
	if !slices.Equal(ids, want) || fl.cfg.Core.VocabSize != 262144 {
		t.Fatalf("ids %v, want %v (vocab %d)", ids, want, fl.cfg.Core.VocabSize)
	}
}
