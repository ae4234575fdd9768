package fleet

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"kvrouter/internal/enginesim"
)

// startEngineSim runs a real engine-sim on loopback and returns its URL.
func startEngineSim(t *testing.T, cfg enginesim.Config) string {
	t.Helper()
	srv, err := enginesim.New(cfg, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("engine-sim: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}

// TestModelCheckEngineSim: the field trial's set-up, against a real
// engine-sim serving meta-llama/Llama-3.1-8B-Instruct (and a LoRA adapter)
// with max_model_len 32768. A group configured as "llama-3.1-8b" is not
// ready (one error line naming both names, kvrouter_fleet_model_not_served
// 1, logged once over repeated checks); the group configured with the
// served name is ready, and MaxModelLen reports the engine's figure for it
// and for the adapter.
func TestModelCheckEngineSim(t *testing.T) {
	served := "meta-llama/Llama-3.1-8B-Instruct"
	url := startEngineSim(t, enginesim.Config{
		Core:            enginesim.CoreConfig{Profile: enginesim.ProfileFast, MaxModelLen: 32768, NumGPUBlocks: 4096},
		ServedModelName: served,
	})
	other := startEngineSim(t, enginesim.Config{
		Core:            enginesim.CoreConfig{Profile: enginesim.ProfileFast, MaxModelLen: 32768, NumGPUBlocks: 4096},
		ServedModelName: served,
		LoRAModules:     []string{"sql-lora"},
	})
	logs := &lockedBuf{}
	f, err := New(Config{Endpoints: []EndpointConfig{
		{Name: "wrong", URL: url, Models: []string{"llama-3.1-8b"}},
		{Name: "right", URL: other, Models: []string{served, "sql-lora"}},
	}, ProbeInterval: time.Hour}, slog.New(slog.NewTextHandler(logs, nil)), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer f.cfg.Client.CloseIdleConnections()
	ctx := t.Context()
	wrong, right := f.Endpoint("wrong"), f.Endpoint("right")
	for _, ep := range f.All() {
		f.probe(ctx, ep)
	}
	if !f.Ready() {
		t.Fatal("not ready before the model check: a probe passed on each")
	}
	for range 3 {
		f.checkModels(ctx, wrong)
		f.checkModels(ctx, right)
	}
	if f.Ready() {
		t.Fatal("ready while no engine of llama-3.1-8b serves it")
	}
	st := f.States("llama-3.1-8b")
	if !st[0].ModelMissing || st[0].Routable() {
		t.Errorf("wrong name: state %+v, want model missing, not routable", st[0])
	}
	if st := f.States(served); st[0].ModelMissing || !st[0].Routable() {
		t.Errorf("served name: state %+v", st[0])
	}
	lines := strings.Count(logs.String(), "engine does not serve the configured model name")
	if lines != 1 || !strings.Contains(logs.String(), `endpoint=wrong model=llama-3.1-8b served=[`+served+`]`) {
		t.Errorf("%d lines, want 1 naming both names:\n%s", lines, logs)
	}
	if v := testutil.ToFloat64(f.m.notServed.WithLabelValues("wrong", "llama-3.1-8b")); v != 1 {
		t.Errorf("model_not_served{wrong} = %v, want 1", v)
	}
	if v := testutil.ToFloat64(f.m.notServed.WithLabelValues("right", served)); v != 0 {
		t.Errorf("model_not_served{right} = %v, want 0", v)
	}
	for _, c := range []struct {
		ep    *Endpoint
		model string
		want  int
	}{{right, served, 32768}, {right, "sql-lora", 32768}, {wrong, served, 32768}, {wrong, "llama-3.1-8b", 0}} {
		if got := c.ep.MaxModelLen(c.model); got != c.want {
			t.Errorf("%s MaxModelLen(%q) = %d, want %d", c.ep.Name(), c.model, got, c.want)
		}
	}
}

// TestModelCheckRecovers: a listing that fails changes nothing; an engine
// restarted with the right name makes the endpoint ready again (one info
// line, gauge back to 0), and a changed max_model_len is picked up.
func TestModelCheckRecovers(t *testing.T) {
	var body atomic.Pointer[string]
	set := func(s string) { body.Store(&s) }
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := *body.Load()
		if b == "" {
			w.WriteHeader(500)
			return
		}
		io.WriteString(w, b)
	}))
	defer srv.Close()
	logs := &lockedBuf{}
	f, err := New(Config{Endpoints: []EndpointConfig{{Name: "e", URL: srv.URL, Models: []string{"m"}}}, ProbeInterval: -1},
		slog.New(slog.NewTextHandler(logs, nil)), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer f.cfg.Client.CloseIdleConnections()
	ep := f.Endpoint("e")
	set("")
	f.checkModels(t.Context(), ep)
	if !f.Ready() || ep.MaxModelLen("m") != 0 {
		t.Fatal("a failed listing changed readiness or invented a max_model_len")
	}
	set(`{"object":"list","data":[{"id":"x","max_model_len":100}]}`)
	f.checkModels(t.Context(), ep)
	if f.Ready() {
		t.Fatal("ready while the engine serves x, not m")
	}
	set("")
	f.checkModels(t.Context(), ep)
	if f.Ready() {
		t.Fatal("a failed listing cleared the verdict")
	}
	set(`{"object":"list","data":[{"id":"m","max_model_len":4096}]}`)
	f.checkModels(t.Context(), ep)
	if !f.Ready() || ep.MaxModelLen("m") != 4096 {
		t.Fatalf("after the fix: ready %v, max_model_len %d", f.Ready(), ep.MaxModelLen("m"))
	}
	if v := testutil.ToFloat64(f.m.notServed.WithLabelValues("e", "m")); v != 0 {
		t.Errorf("gauge %v after the fix", v)
	}
	if !strings.Contains(logs.String(), `msg="engine serves the configured model name" endpoint=e model=m`) {
		t.Errorf("no recovery line:\n%s", logs)
	}
	set(`{"object":"list","data":[{"id":"m","max_model_len":2048}]}`)
	f.checkModels(t.Context(), ep)
	if ep.MaxModelLen("m") != 2048 {
		t.Errorf("max_model_len %d after the engine changed it", ep.MaxModelLen("m"))
	}
}
