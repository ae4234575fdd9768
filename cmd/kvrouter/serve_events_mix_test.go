package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestServeWarnsEngineWithoutEvents: a router.yaml model whose engines
// are partly on events logs one warning per engine without (named), and
// none when every engine or no engine has events.
func TestServeWarnsEngineWithoutEvents(t *testing.T) {
	sio := stdio{out: &bytes.Buffer{}, err: &bytes.Buffer{}}
	for _, c := range []struct {
		name, engines string
		warned        []string
	}{
		{"mixed", `[{name: a, url: "http://127.0.0.1:1", events: "tcp://127.0.0.1:2"}, {name: b, url: "http://127.0.0.1:3"}, {url: "http://127.0.0.1:4"}]`, []string{"engine=b", "engine=http://127.0.0.1:4"}},
		{"all", `[{name: a, url: "http://127.0.0.1:1", events: "tcp://127.0.0.1:2"}, {name: b, url: "http://127.0.0.1:3", events: "tcp://127.0.0.1:5"}]`, nil},
		{"none", `[{name: a, url: "http://127.0.0.1:1"}, {name: b, url: "http://127.0.0.1:3"}]`, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "router.yaml")
			if err := os.WriteFile(path, []byte("models:\n  - name: m\n    tokenizer: none\n    engines: "+c.engines+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			fl, err := parseServeFlags([]string{"--config", path}, func(string) string { return "" }, sio)
			if err != nil {
				t.Fatal(err)
			}
			var logs lockedBuffer
			app, err := buildServe(t.Context(), fl, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})))
			if err != nil {
				t.Fatal(err)
			}
			app.close()
			var got []string
			for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
				if strings.Contains(line, "engine without events") {
					if !strings.Contains(line, "model=m") {
						t.Errorf("warning without the model: %s", line)
					}
					for _, f := range strings.Fields(line) {
						if strings.HasPrefix(f, "engine=") {
							got = append(got, f)
						}
					}
				}
			}
			if strings.Join(got, " ") != strings.Join(c.warned, " ") {
				t.Errorf("warned for %v, want %v\nlogs:\n%s", got, c.warned, logs.String())
			}
		})
	}
}
