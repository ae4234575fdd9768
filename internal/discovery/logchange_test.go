package discovery

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"kvrouter/internal/config"
)

// TestLogChange: each change of a listed engine is logged as what it is; a
// new Pod at an old Pod's address is a replacement, and "engine API key
// changed" appears only when the key did change (and never shows the key).
func TestLogChange(t *testing.T) {
	a := Engine{Name: "vllm-a", Addr: "10.1.0.5:8000", State: StateReady}
	keyed := a
	keyed.APIKey = "sk-secret-1"
	for _, c := range []struct {
		name     string
		old, cur Engine
		want     []string // log messages, in order
	}{
		{"new pod at the address", a, Engine{Name: "vllm-b", Addr: a.Addr, State: StateReady}, []string{"engine replaced: another pod at its address"}},
		{"new pod with a key at the address", keyed, Engine{Name: "vllm-b", Addr: a.Addr, State: StateReady, APIKey: "sk-secret-2"}, []string{"engine replaced: another pod at its address"}},
		{"key set", a, keyed, []string{"engine API key changed"}},
		{"key rotated", keyed, Engine{Name: a.Name, Addr: a.Addr, State: StateReady, APIKey: "sk-secret-2"}, []string{"engine API key changed"}},
		{"state", a, Engine{Name: a.Name, Addr: a.Addr, State: StateDraining}, []string{"engine state"}},
		{"settings", a, Engine{Name: a.Name, Addr: a.Addr, State: StateReady, Settings: config.EngineSettings{EventsPort: 5557}}, []string{"engine settings changed"}},
		{"state and key", a, Engine{Name: a.Name, Addr: a.Addr, State: StateNotReady, APIKey: "sk-secret-1"}, []string{"engine state", "engine API key changed"}},
		{"role", a, Engine{Name: a.Name, Addr: a.Addr, State: StateReady, Role: config.RolePrefill}, []string{"engine role changed"}},
		{"unchanged", a, a, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			var buf bytes.Buffer
			s := &Source{log: slog.New(slog.NewTextHandler(&buf, nil))}
			s.logChange([]Engine{c.old}, []Engine{c.cur})
			var got []string
			for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
				if _, msg, ok := strings.Cut(line, "msg="); ok {
					msg = strings.TrimPrefix(msg, `"`)
					msg, _, _ = strings.Cut(msg, `"`)
					msg, _, _ = strings.Cut(msg, " engine=")
					got = append(got, msg)
				}
			}
			if strings.Join(got, "|") != strings.Join(c.want, "|") {
				t.Errorf("logged %q, want %q:\n%s", got, c.want, buf.String())
			}
			if strings.Contains(buf.String(), "sk-secret") {
				t.Errorf("a key was logged:\n%s", buf.String())
			}
		})
	}
}
