// Package browsertest drives Debian's headless Chromium for tests over the
// DevTools protocol on a pipe (--remote-debugging-pipe: JSON messages
// ending in NUL on file descriptors 3 and 4), so no WebSocket library is
// needed. Network access is held to 127.0.0.1 and file:// URLs. Without
// chromium a test skips, or fails under KVROUTER_TOOLS_REQUIRED=1.
package browsertest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"kvrouter/internal/promtest"
)

// Page is one Chromium tab attached over the DevTools protocol.
type Page struct {
	t       *testing.T
	w       *os.File
	replies chan map[string]json.RawMessage
	mu      sync.Mutex
	id      int
	session string
}

// Open launches chromium headless, with networking held to loopback
// (every host but 127.0.0.1 resolves to nothing), opens url in a new tab
// and attaches to it. Chromium is killed when the test ends.
func Open(t *testing.T, url string) *Page {
	t.Helper()
	bin := promtest.Tool(t, "chromium")
	toChrome, ourW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	ourR, fromChrome, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	// The profile is not t.TempDir: Chromium's helper processes can still
	// write there for a moment after the browser dies, and t.TempDir's
	// removal then fails the test ("directory not empty"). Cleanup kills
	// the whole process group, waits until it is gone, then removes it.
	profile, err := os.MkdirTemp("", "kvrouter-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--headless=new", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
		"--user-data-dir="+profile, "--window-size=1400,1000", "--no-first-run", "--no-default-browser-check",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-extensions",
		"--disable-default-apps", "--disable-domain-reliability", "--no-pings", "--metrics-recording-only",
		"--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", "about:blank")
	cmd.ExtraFiles = []*os.File{toChrome, fromChrome}     // fd 3: chromium reads, fd 4: it writes
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its helpers join its group
	if err := cmd.Start(); err != nil {
		os.RemoveAll(profile)
		t.Fatal(err)
	}
	toChrome.Close()
	fromChrome.Close()
	c := &Page{t: t, w: ourW, replies: make(chan map[string]json.RawMessage, 64)}
	go func() {
		r := bufio.NewReaderSize(ourR, 1<<20)
		for {
			msg, err := r.ReadBytes(0)
			if err != nil {
				close(c.replies)
				return
			}
			var m map[string]json.RawMessage
			if json.Unmarshal(msg[:len(msg)-1], &m) == nil && m["id"] != nil {
				c.replies <- m
			}
		}
	}()
	t.Cleanup(func() {
		ourW.Close()
		pgid := cmd.Process.Pid
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		_ = cmd.Wait()
		ourR.Close()
		// The group's other processes are children of the browser, now
		// reparented; wait (up to 10 s) until none is left.
		for deadline := time.Now().Add(10 * time.Second); syscall.Kill(-pgid, 0) == nil && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		}
		var err error
		for range 50 { // a write in flight when the last helper died
			if err = os.RemoveAll(profile); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			t.Errorf("chromium profile %s: %v", profile, err)
		}
	})
	var target struct {
		TargetID string `json:"targetId"`
	}
	c.Call("Target.createTarget", map[string]any{"url": url}, &target)
	var att struct {
		SessionID string `json:"sessionId"`
	}
	c.Call("Target.attachToTarget", map[string]any{"targetId": target.TargetID, "flatten": true}, &att)
	c.session = att.SessionID
	return c
}

// Call sends one command (to the attached page once there is one) and
// decodes its result into out.
func (c *Page) Call(method string, params map[string]any, out any) {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.id++
	msg := map[string]any{"id": c.id, "method": method, "params": params}
	if c.session != "" {
		msg["sessionId"] = c.session
	}
	b, _ := json.Marshal(msg)
	if _, err := c.w.Write(append(b, 0)); err != nil {
		c.t.Fatalf("cdp %s: %v", method, err)
	}
	timeout := time.After(30 * time.Second)
	for {
		select {
		case m, ok := <-c.replies:
			if !ok {
				c.t.Fatalf("cdp %s: chromium closed the pipe", method)
			}
			if string(m["id"]) != fmt.Sprint(c.id) {
				continue
			}
			if m["error"] != nil {
				c.t.Fatalf("cdp %s: %s", method, m["error"])
			}
			if out != nil {
				if err := json.Unmarshal(m["result"], out); err != nil {
					c.t.Fatalf("cdp %s: %v", method, err)
				}
			}
			return
		case <-timeout:
			c.t.Fatalf("cdp %s: no answer within 30 s", method)
		}
	}
}

// Eval evaluates a JavaScript expression in the page and decodes its
// JSON-serializable value into out.
func (c *Page) Eval(expr string, out any) {
	c.t.Helper()
	var res struct {
		Result struct {
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		ExceptionDetails json.RawMessage `json:"exceptionDetails"`
	}
	c.Call("Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true}, &res)
	if res.ExceptionDetails != nil {
		c.t.Fatalf("eval %s: %s", expr, res.ExceptionDetails)
	}
	if err := json.Unmarshal(res.Result.Value, out); err != nil {
		c.t.Fatalf("eval %s: %v (%s)", expr, err, res.Result.Value)
	}
}

// Screenshot returns the page as PNG.
func (c *Page) Screenshot() []byte {
	c.t.Helper()
	var res struct {
		Data []byte `json:"data"` // base64 in JSON
	}
	c.Call("Page.captureScreenshot", map[string]any{"format": "png", "captureBeyondViewport": true}, &res)
	return res.Data
}
