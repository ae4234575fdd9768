package serve

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"kvrouter/internal/config"
)

// TestServeWarnsEngineWithoutEvents: a router.yaml model whose engines
// are partly on events logs one warning per engine without (named), and
// none when every engine or no engine has events.
func TestServeWarnsEngineWithoutEvents(t *testing.T) {
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
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			cfg, pos, err := config.Parse(data, func(string) string { return "" })
			if err != nil {
				t.Fatal(err)
			}
			var logs lockedBuffer
			app, err := New(t.Context(), Options{Config: cfg, Positions: pos, Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
			if err != nil {
				t.Fatal(err)
			}
			app.Close()
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

// lockedBuffer is a bytes.Buffer safe for the concurrent writes of a
// logger shared by goroutines.
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
