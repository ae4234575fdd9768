package proxy

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"kvrouter/internal/config"
	"kvrouter/internal/fleet"
)

// poolingEngine answers any POST with its name and the body it got.
func poolingEngine(name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"engine": name, "path": r.URL.Path, "body": json.RawMessage(b)})
	}
}

// TestPassthrough: pooling, scoring and tokenizer endpoints go to the
// healthy engine with the fewest requests in flight, an alias's name
// becomes its group's, a connection error moves to the other engine, and
// unknown models get OpenAI's 404.
func TestPassthrough(t *testing.T) {
	rg := newRig(t, 2, func(c *config.Config, _ *fleet.Config) {
		c.Models[0].Aliases = []config.Alias{{Name: "m-fast"}}
	})
	for _, e := range rg.engines {
		e.srv.Config.Handler = poolingEngine(e.name)
	}
	type answer struct {
		Engine string          `json:"engine"`
		Path   string          `json:"path"`
		Body   json.RawMessage `json:"body"`
	}
	call := func(path, body string) (int, answer, string) {
		t.Helper()
		resp := rg.post(path, body)
		out := readAll(t, resp)
		var a answer
		_ = json.Unmarshal([]byte(out), &a)
		return resp.StatusCode, a, out
	}
	for _, p := range passthroughPaths {
		if st, a, out := call(p, `{"model":"m","input":"hello"}`); st != 200 || a.Engine != "e0" || a.Path != p {
			t.Errorf("%s: %d %s, want e0", p, st, out)
		}
	}
	e0 := rg.fleet.Endpoint("e0")
	e0.AddInFlight(3)
	if st, a, out := call("/v1/embeddings", `{"model":"m-fast","input":"hello"}`); st != 200 || a.Engine != "e1" || !strings.Contains(string(a.Body), `"model":"m"`) {
		t.Errorf("e0 busy, alias: %d %s, want e1 and model m", st, out)
	}
	e0.AddInFlight(-3)
	if st, a, _ := call("/tokenize", `{"prompt":"hi"}`); st != 200 || a.Engine != "e0" {
		t.Errorf("/tokenize without model: %d %s", st, a.Engine)
	}
	rg.engines[0].srv.Close() // connection refused: the other engine answers
	if st, a, out := call("/v1/rerank", `{"model":"m","query":"q","documents":["a"]}`); st != 200 || a.Engine != "e1" {
		t.Errorf("e0 down: %d %s", st, out)
	}
	if st, _, out := call("/v1/score", `{"model":"nope"}`); st != 404 || !strings.Contains(out, `"type":"not_found_error"`) {
		t.Errorf("unknown model: %d %s", st, out)
	}
	if st, _, out := call("/v1/embeddings", `[1,2]`); st != 400 || !strings.Contains(out, `"invalid_request_error"`) {
		t.Errorf("not an object: %d %s", st, out)
	}
}
