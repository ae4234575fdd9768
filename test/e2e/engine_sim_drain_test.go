package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// drainSim is an engine-sim process for the SIGTERM tests.
type drainSim struct {
	cmd    *exec.Cmd
	addr   string
	logs   *lockedBuffer
	exited chan struct{} // closed when the process has ended
	err    error         // its exit status, set before exited closes
	exitAt time.Time
}

// startDrainSim runs "kvrouter engine-sim" with --shutdown-timeout
// seconds and steps of 20 ms (one token each per stream), waiting for
// /health.
func startDrainSim(t *testing.T, bin string, shutdownTimeout int) *drainSim {
	t.Helper()
	port := e2eFreePort(t)
	s := &drainSim{addr: "127.0.0.1:" + strconv.Itoa(port), logs: &lockedBuffer{}, exited: make(chan struct{})}
	s.cmd = exec.Command(bin, "engine-sim", "--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"--profile", "fast", "--step-overhead", "20ms", "--shutdown-timeout", strconv.Itoa(shutdownTimeout))
	s.cmd.Stderr = s.logs
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		s.err = s.cmd.Wait()
		s.exitAt = time.Now()
		close(s.exited)
	}()
	t.Cleanup(func() {
		_ = s.cmd.Process.Kill()
		<-s.exited
	})
	e2eEventually(t, 20*time.Second, "engine-sim healthy", func() bool {
		resp, err := http.Get("http://" + s.addr + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return s
}

// streamResult is what one streamed completion saw.
type streamResult struct {
	status int
	chunks int  // data lines before [DONE]
	done   bool // ended with data: [DONE]
	err    error
	at     time.Time // when the stream ended
}

// startStream posts a streamed completion of maxTokens tokens and returns
// once its first chunk has arrived; the result comes on the channel.
func startStream(t *testing.T, addr string, maxTokens int) <-chan streamResult {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"prompt": "drain me " + strings.Repeat("x", 64), "max_tokens": maxTokens, "stream": true})
	tr := &http.Transport{DisableKeepAlives: true}
	resp, err := (&http.Client{Transport: tr}).Post("http://"+addr+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan streamResult, 1)
	first := make(chan struct{})
	go func() {
		defer resp.Body.Close()
		r := streamResult{status: resp.StatusCode}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			line := sc.Text()
			if !strings.HasPrefix(line, "data: ") {
				continue
			}
			if line == "data: [DONE]" {
				r.done = true
				continue
			}
			if r.chunks++; r.chunks == 1 {
				close(first)
			}
		}
		if r.chunks == 0 {
			close(first)
		}
		r.err, r.at = sc.Err(), time.Now()
		out <- r
	}()
	select {
	case <-first:
	case <-time.After(20 * time.Second):
		t.Fatal("no first chunk in 20 s")
	}
	return out
}

// refused reports whether a new TCP connection to addr is refused.
func refused(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		c.Close()
		return false
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

// TestEngineSimDrain sends SIGTERM to a real engine-sim process while
// streams are in flight, as the kubelet does to a deleted Pod. With
// --shutdown-timeout longer than the streams (vLLM's drain mode), new
// connections are refused at once, every stream in flight still ends with
// [DONE], and the process exits 0 once they have; with a timeout shorter
// than the streams, it exits after the timeout and the streams still
// running are cut (no [DONE]).
func TestEngineSimDrain(t *testing.T) {
	bin := e2eBuild(t)

	t.Run("Drained", func(t *testing.T) {
		s := startDrainSim(t, bin, 60)
		const n, tokens = 4, 60 // 60 steps of >= 20 ms: >= 1.2 s per stream
		var streams []<-chan streamResult
		for range n {
			streams = append(streams, startStream(t, s.addr, tokens))
		}
		t0 := time.Now()
		if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		e2eEventually(t, 10*time.Second, "new connections refused after SIGTERM", func() bool { return refused(s.addr) })
		refusedAt := time.Now()
		var last time.Time
		for i, ch := range streams {
			var r streamResult
			select {
			case r = <-ch:
			case <-time.After(30 * time.Second):
				t.Fatalf("stream %d: not ended 30 s after SIGTERM; logs:\n%s", i, s.logs.String())
			}
			if r.status != 200 || !r.done || r.chunks != tokens || r.err != nil {
				t.Errorf("stream %d: status %d, %d of %d chunks, [DONE] %v, err %v", i, r.status, r.chunks, tokens, r.done, r.err)
			}
			if r.at.After(last) {
				last = r.at
			}
		}
		if !last.After(refusedAt) {
			t.Errorf("every stream ended before new connections were refused: nothing was drained")
		}
		select {
		case <-s.exited:
		case <-time.After(20 * time.Second):
			t.Fatalf("process still running 20 s after its last stream ended; logs:\n%s", s.logs.String())
		}
		if s.err != nil {
			t.Errorf("exit: %v; logs:\n%s", s.err, s.logs.String())
		}
		if s.exitAt.Before(last) {
			t.Errorf("process exited %v before its last stream ended", last.Sub(s.exitAt))
		}
		if !strings.Contains(s.logs.String(), "engine-sim drained") {
			t.Errorf("no drained line in logs:\n%s", s.logs.String())
		}
		t.Logf("SIGTERM -> refused %v, last [DONE] %v, exit %v",
			refusedAt.Sub(t0).Round(time.Millisecond), last.Sub(t0).Round(time.Millisecond), s.exitAt.Sub(t0).Round(time.Millisecond))
	})

	t.Run("GracePeriodOver", func(t *testing.T) {
		const timeout = 1 // second
		s := startDrainSim(t, bin, timeout)
		const tokens = 1500 // >= 30 s of steps: outlives the timeout
		ch := startStream(t, s.addr, tokens)
		t0 := time.Now()
		if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		var r streamResult
		select {
		case r = <-ch:
		case <-time.After(20 * time.Second):
			t.Fatalf("stream not cut 20 s after SIGTERM with --shutdown-timeout %d; logs:\n%s", timeout, s.logs.String())
		}
		if r.done || r.chunks >= tokens {
			t.Errorf("stream finished (%d chunks, [DONE] %v) though it outlived --shutdown-timeout", r.chunks, r.done)
		}
		select {
		case <-s.exited:
		case <-time.After(20 * time.Second):
			t.Fatalf("process still running 20 s after SIGTERM; logs:\n%s", s.logs.String())
		}
		took := s.exitAt.Sub(t0)
		// The timeout, then at most the 5 s an aborted server gets to close.
		if took < timeout*time.Second || took > (timeout+5)*time.Second {
			t.Errorf("exit %v after SIGTERM, want between %d s and %d s", took, timeout, timeout+5)
		}
		if !regexp.MustCompile(`shutdown timeout: aborting the requests still in flight.* in_flight=1`).MatchString(s.logs.String()) {
			t.Errorf("no abort line naming 1 request in flight:\n%s", s.logs.String())
		}
		t.Logf("SIGTERM -> stream cut %v after %d chunks, exit %v", r.at.Sub(t0).Round(time.Millisecond), r.chunks, took.Round(time.Millisecond))
	})
}
