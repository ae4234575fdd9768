package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestServeQuickFlags(t *testing.T) {
	var errb bytes.Buffer
	fl, err := parseServeFlags([]string{"--listen", "127.0.0.1:0", "--model", "llama",
		"--engine", "http://a:8000", "--engine", "http://b:8000", "--engine", "http://c:8000",
		"--events", "tcp://a:5557", "--events", "tcp://b:5557", "--events", "tcp://c:5557",
		"--replay", "tcp://a:5558", "--replay", "tcp://b:5558", "--replay", "tcp://c:5558",
		"--tokenizer", "none", "--policy", "least_load"}, func(string) string { return "" }, stdio{out: &errb, err: &errb})
	if err != nil {
		t.Fatal(err)
	}
	c := fl.opts.Config
	if c.Listen != "127.0.0.1:0" || len(c.Models) != 1 {
		t.Fatalf("%+v", c)
	}
	m := c.Models[0]
	if m.Name != "llama" || m.Tokenizer != "none" || m.Policy != "least_load" || len(m.Engines) != 3 {
		t.Fatalf("%+v", m)
	}
	want := [][3]string{{"http://a:8000", "tcp://a:5557", "tcp://a:5558"}, {"http://b:8000", "tcp://b:5557", "tcp://b:5558"}, {"http://c:8000", "tcp://c:5557", "tcp://c:5558"}}
	for i, w := range want {
		if e := m.Engines[i]; e.URL != w[0] || e.Events != w[1] || e.Replay != w[2] {
			t.Errorf("engine %d = %+v, want %v", i, e, w)
		}
	}
}

func TestServeFlagErrors(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	os.WriteFile(good, []byte("models: [{name: m, engines: [{url: 'http://a:1'}]}]\n"), 0o644)
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("models:\n  - name: m\n    engines:\n      - url: 'http://a:1'\n        event: tcp://a:5557\n"), 0o644)
	tests := []struct {
		name  string
		args  []string
		usage bool
		want  string
	}{
		{"nothing", nil, true, "want --config FILE"},
		{"engine without model", []string{"--engine", "http://a:1"}, true, "want --config"},
		{"more events than engines", []string{"--model", "m", "--engine", "http://a:1", "--events", "tcp://a:1", "--events", "tcp://b:1"}, true, "more --events"},
		{"fewer events than engines", []string{"--model", "m", "--engine", "http://a:1", "--engine", "http://b:1", "--engine", "http://c:1", "--events", "tcp://a:1", "--events", "tcp://b:1"}, true, "2 --events for 3 --engine: give one --events per --engine, in --engine order, or none"},
		{"fewer replays than engines", []string{"--model", "m", "--engine", "http://a:1", "--engine", "http://b:1", "--events", "tcp://a:1", "--events", "tcp://b:1", "--replay", "tcp://a:2"}, true, "1 --replay for 2 --engine: give one --replay per --engine"},
		{"config and quick form", []string{"--config", good, "--model", "m"}, true, "excludes"},
		{"bad policy", []string{"--model", "m", "--engine", "http://a:1", "--policy", "best"}, true, `unknown policy "best"`},
		{"bad url", []string{"--model", "m", "--engine", "a:1"}, true, "want http(s)"},
		{"unknown field in file", []string{"--config", bad}, false, `models[0].engines[0].event (line 5): unknown field "event"`},
		{"udp events", []string{"--model", "m", "--engine", "http://a:1", "--events", "udp://x"}, true, `models[0].engines[0].events: "udp://x": unsupported transport`},
		{"missing file", []string{"--config", filepath.Join(dir, "nope.yaml")}, false, "no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			_, err := parseServeFlags(tt.args, func(string) string { return "" }, stdio{out: &b, err: &b})
			if err == nil {
				t.Fatal("want an error")
			}
			if errors.Is(err, errUsage) != tt.usage {
				t.Errorf("usage error = %v, want %v (%v)", errors.Is(err, errUsage), tt.usage, err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q lacks %q", err, tt.want)
			}
		})
	}
	fl, err := parseServeFlags([]string{"--config", good, "--listen", "127.0.0.1:9"}, func(string) string { return "" }, stdio{})
	if err != nil || fl.opts.Config.Listen != "127.0.0.1:9" || fl.opts.Config.Models[0].Policy != "kv" {
		t.Errorf("config + --listen: %+v %v", fl, err)
	}
}

// TestServeQuickEventsBind: --events-bind makes kvrouter bind every
// --events address of the quick form; without it a wildcard is refused.
func TestServeQuickEventsBind(t *testing.T) {
	var errb bytes.Buffer
	sio := stdio{out: &errb, err: &errb}
	args := []string{"--model", "m", "--engine", "http://a:1", "--engine", "http://b:1", "--events", "tcp://*:5557", "--events", "tcp://*:5558"}
	fl, err := parseServeFlags(append(args, "--events-bind"), func(string) string { return "" }, sio)
	if err != nil {
		t.Fatal(err)
	}
	if e := fl.opts.Config.Models[0].Engines; !e[0].EventsBind || e[0].Events != "tcp://*:5557" || !e[1].EventsBind || e[1].Events != "tcp://*:5558" {
		t.Fatalf("engines %+v", e)
	}
	if _, err := parseServeFlags(args, func(string) string { return "" }, sio); err == nil || !strings.Contains(err.Error(), "events_bind: true binds it") {
		t.Fatalf("wildcard without --events-bind: %v", err)
	}
	_, err = parseServeFlags([]string{"--model", "m", "--engine", "http://a:1", "--engine", "http://b:1",
		"--events", "tcp://127.0.0.1:5557", "--events", "tcp://127.0.0.1:5557", "--events-bind"}, func(string) string { return "" }, sio)
	if err == nil || !strings.Contains(err.Error(), "already bound") {
		t.Fatalf("two engines on one bound address: %v", err)
	}
}

// TestServeQuickEventsQueue: --events-queue sets every engine's KV event
// queue (default 1024); a value out of range is a usage error naming the
// field.
func TestServeQuickEventsQueue(t *testing.T) {
	var errb bytes.Buffer
	sio := stdio{out: &errb, err: &errb}
	args := []string{"--model", "m", "--engine", "http://a:1", "--engine", "http://b:1", "--events", "tcp://127.0.0.1:5557", "--events", "tcp://127.0.0.1:5558"}
	for _, tc := range []struct {
		flags []string
		want  int
	}{{nil, 1024}, {[]string{"--events-queue", "8192"}, 8192}} {
		fl, err := parseServeFlags(append(args, tc.flags...), func(string) string { return "" }, sio)
		if err != nil {
			t.Fatal(err)
		}
		if e := fl.opts.Config.Models[0].Engines; e[0].EventsQueue != tc.want || e[1].EventsQueue != tc.want {
			t.Fatalf("%v: engines %+v, want events_queue %d", tc.flags, e, tc.want)
		}
	}
	_, err := parseServeFlags(append(args, "--events-queue", "-3"), func(string) string { return "" }, sio)
	if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "events_queue: -3: must be in 1..1048576") {
		t.Fatalf("--events-queue -3: %v", err)
	}
}

// TestServeQuickEventsAllOrNone: the quick form takes one --events per
// --engine or none (every engine on the approximate index); fewer is refused
// (TestServeFlagErrors), since the event-fed index never sees the rest.
func TestServeQuickEventsAllOrNone(t *testing.T) {
	var errb bytes.Buffer
	sio := stdio{out: &errb, err: &errb}
	two := []string{"--model", "m", "--engine", "http://a:1", "--engine", "http://b:1"}
	fl, err := parseServeFlags(two, func(string) string { return "" }, sio)
	if err != nil {
		t.Fatalf("no --events: %v", err)
	}
	if e := fl.opts.Config.Models[0].Engines; len(e) != 2 || e[0].Events != "" || e[1].Events != "" {
		t.Fatalf("no --events: engines %+v", e)
	}
	fl, err = parseServeFlags(append(two, "--events", "tcp://a:5557", "--events", "tcp://b:5557"), func(string) string { return "" }, sio)
	if err != nil {
		t.Fatalf("one --events each: %v", err)
	}
	if e := fl.opts.Config.Models[0].Engines; e[0].Events != "tcp://a:5557" || e[1].Events != "tcp://b:5557" {
		t.Fatalf("one --events each: engines %+v", e)
	}
}

// The listener flags override router.yaml; with admin_listen, /metrics
// leaves the main listener for the admin one, and both listeners count
// their connections.
func TestServeAdminListen(t *testing.T) {
	var errb bytes.Buffer
	fl, err := parseServeFlags([]string{"--model", "m", "--engine", "http://a:8000", "--tokenizer", "none",
		"--admin-listen", "127.0.0.1:9999", "--max-connections", "77", "--header-timeout", "3s",
		"--body-idle-timeout", "4s", "--idle-timeout", "5s"}, func(string) string { return "" }, stdio{out: &errb, err: &errb})
	if err != nil {
		t.Fatal(err)
	}
	if h := fl.opts.Config.HTTP; fl.opts.Config.AdminListen != "127.0.0.1:9999" || h.MaxConnections != 77 || h.HeaderTimeout != 3*time.Second ||
		h.BodyIdleTimeout != 4*time.Second || h.IdleTimeout != 5*time.Second || h.ReservedConnections != 32 {
		t.Fatalf("flags not applied: admin %q, http %+v", fl.opts.Config.AdminListen, h)
	}
}
