package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"testing"
	"time"
)

// e2eReadyState is the part of GET /ready's body the tests read.
type e2eReadyState struct {
	Ready  bool `json:"ready"`
	Models []struct {
		Engines []struct {
			Name   string `json:"name"`
			Up     bool   `json:"up"`
			Events string `json:"events"`
		} `json:"engines"`
	} `json:"models"`
}

func (r *e2eRouter) ready(query string) (int, e2eReadyState) {
	r.t.Helper()
	resp, err := r.client.Get(r.url + "/ready" + query)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var st e2eReadyState
	if err := json.Unmarshal(b, &st); err != nil {
		r.t.Fatalf("/ready body %q: %v", b, err)
	}
	return resp.StatusCode, st
}

// engine returns the named engine's state.
func (st e2eReadyState) engine(name string) (up bool, events string) {
	for _, e := range st.Models[0].Engines {
		if e.Name == name {
			return e.Up, e.Events
		}
	}
	return false, ""
}

// TestE2EReadyOneOfN: /ready is a readiness probe for the router, not for
// every engine. An engine whose events endpoint is wrong (nothing
// publishes there) and an engine killed while the others serve leave it at
// 200, the degraded engines visible in its body; ?full=1 reports them.
func TestE2EReadyOneOfN(t *testing.T) {
	e2eLeakCheck(t)
	bin := e2eBuild(t)
	a, b := startE2ESimProcess(t, bin), startE2ESimProcess(t, bin)
	wrong := startE2ESim(t)
	wrong.events = fmt.Sprintf("tcp://127.0.0.1:%d", e2eFreePort(t))
	r := startE2ERouterWait(t, "/ready", "tokenizer: none\n", a, b, wrong)
	e2eEventually(t, 20*time.Second, "both good streams connected", func() bool {
		_, st := r.ready("")
		_, ea := st.engine("e0")
		_, eb := st.engine("e1")
		return ea == "connected" && eb == "connected"
	})
	code, st := r.ready("")
	if up, ev := st.engine("e2"); code != 200 || !up || ev != "disconnected" {
		t.Fatalf("wrong events endpoint: /ready %d, e2 up %v events %q", code, up, ev)
	}
	if code, _ := r.ready("?full=1"); code != 503 {
		t.Errorf("/ready?full=1 = %d with e2's stream down, want 503", code)
	}
	if resp, body := r.post("/v1/chat/completions", e2eChat("s", "hi")); resp.StatusCode != 200 {
		t.Fatalf("request: %d %s", resp.StatusCode, body)
	}

	a.stop() // killed while e1 serves
	e2eEventually(t, 20*time.Second, "e0 seen down", func() bool {
		code, st := r.ready("")
		if code != 200 {
			t.Fatalf("/ready %d after losing one of three engines: %+v", code, st)
		}
		up, ev := st.engine("e0")
		return !up && ev == "disconnected"
	})
	if resp, body := r.post("/v1/chat/completions", e2eChat("s", "hello")); resp.StatusCode != 200 {
		t.Fatalf("request after e0 died: %d %s", resp.StatusCode, body)
	}
}
