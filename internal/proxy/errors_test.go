package proxy

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"kvrouter/internal/config"
	"kvrouter/internal/fleet"
	"kvrouter/internal/group"
)

func containsLine(body, line string) bool {
	for l := range strings.Lines(body) {
		if strings.TrimRight(l, "\n") == line {
			return true
		}
	}
	return false
}

// errorOf decodes an OpenAI error body.
func errorOf(t *testing.T, body string) errorDetail {
	t.Helper()
	var e struct {
		Error *errorDetail `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error == nil || e.Error.Message == "" {
		t.Fatalf("not OpenAI's error shape: %q (%v)", body, err)
	}
	return *e.Error
}

// TestErrorTypes: every error the router answers itself uses the one
// vocabulary of docs/serve.md, and none shows an engine's address.
func TestErrorTypes(t *testing.T) {
	type result struct {
		status int
		body   string
	}
	tests := []struct {
		name   string
		status int
		typ    string
		do     func(t *testing.T) result
	}{
		{"401 wrong key", 401, typeAuthentication, func(t *testing.T) result {
			rg := newRig(t, 1, func(c *config.Config, _ *fleet.Config) { c.APIKey = "k" })
			resp := rg.post("/v1/chat/completions", chatBody, "Authorization", "Bearer nope")
			return result{resp.StatusCode, readAll(t, resp)}
		}},
		{"404 unknown path", 404, typeNotFound, func(t *testing.T) result {
			rg := newRig(t, 1)
			resp := rg.post("/v1/no-such-endpoint", `{}`) // /v1/embeddings is passed through now
			return result{resp.StatusCode, readAll(t, resp)}
		}},
		{"404 unknown model", 404, typeNotFound, func(t *testing.T) result {
			rg := newRig(t, 1)
			resp := rg.post("/v1/chat/completions", `{"model":"x","messages":[{"role":"user","content":"a"}]}`)
			return result{resp.StatusCode, readAll(t, resp)}
		}},
		{"413 body limit", 413, typeInvalidRequest, func(t *testing.T) result {
			rg := newRig(t, 1, func(c *config.Config, _ *fleet.Config) { c.BodyLimit = 100 })
			resp := rg.post("/v1/completions", `{"model":"m","prompt":"`+strings.Repeat("a", 200)+`"}`)
			return result{resp.StatusCode, readAll(t, resp)}
		}},
		{"500 router chose an unknown replica", 500, typeServer, func(t *testing.T) result {
			rg := newRig(t, 1)
			rg.router.pick = func(*group.RouteInput) string { return "ghost" }
			resp := rg.post("/v1/chat/completions", chatBody)
			return result{resp.StatusCode, readAll(t, resp)}
		}},
		{"502 engine unreachable", 502, typeServer, func(t *testing.T) result {
			rg := newRig(t, 1, func(c *config.Config, _ *fleet.Config) { c.Models[0].Retries = -1 })
			rg.engines[0].srv.Close()
			resp := rg.post("/v1/chat/completions", chatBody)
			return result{resp.StatusCode, readAll(t, resp)}
		}},
		{"503 no replica", 503, typeServiceUnavailable, func(t *testing.T) result {
			rg := newRig(t, 1)
			rg.fleet.Report(rg.fleet.Endpoint("e0"), fleet.OutcomeConnError)
			resp := rg.post("/v1/chat/completions", chatBody)
			return result{resp.StatusCode, readAll(t, resp)}
		}},
		{"504 first byte", 504, typeServer, func(t *testing.T) result {
			rg := newRig(t, 1, func(c *config.Config, _ *fleet.Config) { c.Models[0].Timeouts.FirstByte = 50 * time.Millisecond })
			rg.engines[0].set(func(e *engine) { e.block = true })
			resp := rg.post("/v1/chat/completions", chatBody)
			r := result{resp.StatusCode, readAll(t, resp)}
			<-rg.engines[0].canceled
			return r
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.do(t)
			if r.status != tt.status {
				t.Fatalf("status %d, want %d: %s", r.status, tt.status, r.body)
			}
			e := errorOf(t, r.body)
			if e.Type != tt.typ || e.Code != tt.status {
				t.Errorf("type %q code %d, want %q %d", e.Type, e.Code, tt.typ, tt.status)
			}
			if strings.Contains(e.Message, "127.0.0.1") {
				t.Errorf("message shows an address: %q", e.Message)
			}
		})
	}
}

// TestStreamErrorEvent: a stream broken mid-way ends with a server_error
// event naming the replica by its configured name, with the request id,
// without the engine's address or the socket error.
func TestStreamErrorEvent(t *testing.T) {
	rg := newRig(t, 1)
	rg.engines[0].set(func(e *engine) { e.chunks = 5; e.failAfter = 2 })
	resp := rg.post("/v1/chat/completions", chatStream, "X-Request-Id", "req-42")
	lines := dataLines(readAll(t, resp))
	if len(lines) != 3 {
		t.Fatalf("events %q", lines)
	}
	e := errorOf(t, strings.TrimPrefix(lines[2], "data: "))
	if e.Type != typeServer || e.Code != http.StatusBadGateway {
		t.Errorf("type %q code %d", e.Type, e.Code)
	}
	if !strings.Contains(e.Message, "replica e0") || !strings.Contains(e.Message, "req-42") ||
		strings.Contains(e.Message, "127.0.0.1") || strings.Contains(e.Message, "EOF") {
		t.Errorf("message %q: want the replica's name and the request id, no address or cause", e.Message)
	}
}
