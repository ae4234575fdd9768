package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// opsSim is an engine-sim process for the operator-tool tests: loopback
// only (HTTP on 127.0.0.1, the KV event PUB socket bound on 127.0.0.1 with
// --kv-events-bind), the Qwen3 tokenizer, the fast timing profile unless
// args override it.
func opsSim(t *testing.T, bin, model string, args ...string) *e2eSim {
	t.Helper()
	ev, rep := e2eFreePort(t), e2eFreePort(t)
	return startSimProc(t, bin, simProcOpts{events: ev, replay: rep}, append([]string{
		"--served-model-name", model, "--profile", "fast", "--tokenizer", e2eQwen3Dir,
		"--max-model-len", "32768", "--num-gpu-blocks-override", "4096", "--kv-events-bind",
		"--kv-events-config", kvEventsConfig("127.0.0.1", ev, rep, "")}, args...)...)
}

// hostPort strips the scheme of a loopback base URL (a scrape target).
func hostPort(u string) string {
	for _, p := range []string{"http://", "https://"} {
		if len(u) > len(p) && u[:len(p)] == p {
			return u[len(p):]
		}
	}
	return u
}

// opsPost sends a JSON body and reads the answer whole; safe to call from
// a goroutine (it returns errors instead of failing the test). A status
// other than 200 is an error.
func opsPost(r *e2eRouter, path, body string) error {
	req, err := http.NewRequest(http.MethodPost, r.url+path, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %d %s", path, resp.StatusCode, b)
	}
	return nil
}

// opsWaitReady waits up to 2 minutes for the router's /ready?full=1 to
// answer 200. Errors are retried: the router accepts connections before it
// serves them (under -race on a loaded machine, loading two tokenizers and
// probing the engines takes tens of seconds).
func opsWaitReady(t *testing.T, url string) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	defer c.CloseIdleConnections()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		resp, err := c.Get(url + "/ready?full=1")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("router not ready within 2 minutes (last: %v)", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
