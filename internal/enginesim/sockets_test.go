package enginesim

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"
)

// shortTempDir is a temporary directory with a path short enough for unix
// socket names (108 bytes).
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "es")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// staleSocket leaves a unix socket file at path that nobody listens on, as
// a SIGKILLed engine does.
func staleSocket(t *testing.T, path string) {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("stale socket %s: %v", path, err)
	}
}

// receiveOne dials a SUB to addr and posts requests until a batch arrives.
func receiveOne(t *testing.T, s *testServer, addr, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	if err := sub.Dial(addr); err != nil {
		t.Fatalf("%s: dial %s: %v", what, addr, err)
	}
	got := make(chan error, 1)
	go func() { _, err := sub.Recv(); got <- err }()
	for i := range 200 {
		post(t, s.url+"/v1/completions", map[string]any{"prompt": fmt.Sprintf("%s %03d %s", what, i, strings.Repeat("i", 40)), "max_tokens": 1})
		select {
		case err := <-got:
			if err != nil {
				t.Fatalf("%s: recv: %v", what, err)
			}
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("%s: no batch received", what)
}

// TestIPCStaleSocketRemoved: ipc endpoints whose socket files a killed
// engine left behind are bound after removing them (libzmq's behaviour),
// and bound again after a simulated restart.
func TestIPCStaleSocketRemoved(t *testing.T) {
	dir := shortTempDir(t)
	pubPath, replayPath := filepath.Join(dir, "pub"), filepath.Join(dir, "replay")
	staleSocket(t, pubPath)
	staleSocket(t, replayPath)
	s := startServer(t, Config{KVEvents: KVEventsConfig{EnableKVCacheEvents: true, Endpoint: "ipc://" + pubPath,
		ReplayEndpoint: "ipc://" + replayPath}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addr, replayAddr, err := s.KVEventsAddrs(ctx)
	if err != nil || addr != "ipc://"+pubPath || replayAddr != "ipc://"+replayPath {
		t.Fatalf("addrs %q %q %v", addr, replayAddr, err)
	}
	receiveOne(t, s, addr, "before")
	if r, b := post(t, s.url+"/admin/restart", nil); r.StatusCode != 200 {
		t.Fatalf("restart: %d %s", r.StatusCode, b)
	}
	receiveOne(t, s, addr, "after")
	if seqs := replaySeqs(t, s); len(seqs) == 0 || seqs[0] != 0 {
		t.Fatalf("replayed seqs after restart %v", seqs)
	}
}

// TestIPCBindErrors: a socket file another process listens on, or a file
// that is no socket, is left alone and the bind fails; Serve returns the
// error and never logs "engine-sim serving".
func TestIPCBindErrors(t *testing.T) {
	dir := shortTempDir(t)
	live := filepath.Join(dir, "live")
	ln, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, pub, replay, path string }{
		{"live pub", "ipc://" + live, "", live},
		{"live replay", "tcp://127.0.0.1:0", "ipc://" + live, live},
		{"plain file", "ipc://" + plain, "", plain},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			s, err := New(Config{Core: CoreConfig{Profile: ProfileFast, NumGPUBlocks: 256, MaxModelLen: 1024},
				KVEvents: KVEventsConfig{EnableKVCacheEvents: true, Endpoint: tc.pub, Bind: true, ReplayEndpoint: tc.replay}},
				slog.New(slog.NewTextHandler(&logs, nil)), prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			hl, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			err = s.Serve(context.Background(), hl)
			if err == nil || !strings.Contains(err.Error(), "bind") {
				t.Fatalf("Serve: %v, want a bind error", err)
			}
			if strings.Contains(logs.String(), "serving") {
				t.Fatalf("logged serving before failing: %s", logs.String())
			}
			if _, err := os.Lstat(tc.path); err != nil {
				t.Fatalf("%s removed: %v", tc.path, err)
			}
		})
	}
	c, err := net.Dial("unix", live) // the live listener still works
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}
