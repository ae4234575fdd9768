package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"kvrouter/internal/fleet"
	"kvrouter/internal/group"
)

// responsesEngine answers /v1/responses as vLLM with the store on: the
// response's id is the body's request_id; a previous_response_id it does
// not hold is vLLM's 404.
type responsesEngine struct {
	mu     sync.Mutex
	held   map[string]bool
	bodies []map[string]any
}

func (re *responsesEngine) handler(name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if id, ok := strings.CutPrefix(r.URL.Path, responsesPath+"/"); ok { // GET /v1/responses/{id}
			re.mu.Lock()
			defer re.mu.Unlock()
			re.bodies = append(re.bodies, map[string]any{"get": id})
			if !re.held[id] {
				w.WriteHeader(http.StatusNotFound)
				return
			}
			fmt.Fprintf(w, `{"id":%q,"object":"response","engine":%q}`, id, name)
			return
		}
		b, _ := io.ReadAll(r.Body)
		var body map[string]any
		_ = json.Unmarshal(b, &body)
		re.mu.Lock()
		defer re.mu.Unlock()
		re.bodies = append(re.bodies, body)
		w.Header().Set("Content-Type", "application/json")
		if prev, _ := body["previous_response_id"].(string); prev != "" && !re.held[prev] {
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprintf(w, `{"error":{"message":"Response with id '%s' not found.","type":"invalid_request_error","param":"response_id","code":404}}`, prev)
			return
		}
		id, _ := body["request_id"].(string)
		re.held[id] = true
		if s, _ := body["stream"].(bool); s {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "event: response.created\ndata: {\"type\":\"response.created\"}\n\n")
			fmt.Fprintf(w, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":%q}}\n\n", id)
			return
		}
		fmt.Fprintf(w, `{"id":%q,"object":"response","engine":%q}`, id, name)
	}
}

// TestResponsePinning: a request without request_id gets one naming the
// chosen engine, and its continuation goes to that engine alone (its 404
// relayed, a 503 while it is unhealthy); a client's own id is learned from
// the answer; an id no router knows is looked for in an id-fixed order,
// moving on past 404s; streams ending in response.completed are whole.
func TestResponsePinning(t *testing.T) {
	rg := newRig(t, 3)
	engines := make([]*responsesEngine, 3)
	for i, e := range rg.engines {
		engines[i] = &responsesEngine{held: map[string]bool{}}
		e.srv.Config.Handler = engines[i].handler(e.name)
	}
	count := func() (n [3]int) {
		for i, re := range engines {
			re.mu.Lock()
			n[i] = len(re.bodies)
			re.mu.Unlock()
		}
		return n
	}
	call := func(body string) (int, string, string) {
		t.Helper()
		resp := rg.post(responsesPath, body)
		return resp.StatusCode, resp.Header.Get("X-Kvrouter-Replica"), readAll(t, resp)
	}
	rg.router.pick = func(in *group.RouteInput) string { return in.Candidates[len(in.Candidates)-1] }

	if resp := rg.post("/v1/route", `{"model":"m","input":"hi"}`); resp.StatusCode != 200 {
		t.Fatalf("/v1/route with a Responses body: %d %s", resp.StatusCode, readAll(t, resp))
	} else {
		resp.Body.Close()
	}
	st, rep, out := call(`{"model":"m","input":"hi"}`)
	var a struct {
		ID string `json:"id"`
	}
	if st != 200 || rep != "e2" || json.Unmarshal([]byte(out), &a) != nil {
		t.Fatalf("first: %d %s %s", st, rep, out)
	}
	if e, ok := responseEngine(a.ID); !ok || e != "e2" {
		t.Fatalf("minted id %q names %q (%v), want e2", a.ID, e, ok)
	}
	before := count()
	// The router would pick e2 anyway: pick e0 to see the pin win.
	rg.router.pick = func(in *group.RouteInput) string { return in.Candidates[0] }
	st, rep, out = call(`{"model":"m","input":"more","previous_response_id":"` + a.ID + `"}`)
	if after := count(); st != 200 || rep != "e2" || after[2] != before[2]+1 || after[0] != before[0] || after[1] != before[1] {
		t.Fatalf("continuation: %d on %s %s, engine calls %v -> %v", st, rep, out, before, after)
	}

	// A tagged id its engine lost: the engine's 404, no other engine asked.
	lost := mintResponseID("e1")
	before = count()
	if st, rep, out := call(`{"model":"m","input":"x","previous_response_id":"` + lost + `"}`); st != 404 || rep != "e1" || !strings.Contains(out, "not found") || count() != [3]int{before[0], before[1] + 1, before[2]} {
		t.Fatalf("lost: %d on %s %s, calls %v -> %v", st, rep, out, before, count())
	}

	// The client's own id: learned from the answer.
	if st, rep, _ := call(`{"model":"m","input":"hi","request_id":"mine-1"}`); st != 200 || rep != "e0" {
		t.Fatalf("client id: %d %s", st, rep)
	}
	rg.router.pick = func(in *group.RouteInput) string { return in.Candidates[len(in.Candidates)-1] }
	before = count()
	if st, rep, _ := call(`{"model":"m","input":"x","previous_response_id":"mine-1"}`); st != 200 || rep != "e0" || count()[0] != before[0]+1 || count()[1] != before[1] || count()[2] != before[2] {
		t.Fatalf("learned: %d on %s, calls %v -> %v", st, rep, before, count())
	}

	// An id this router never saw (another replica's, before a restart):
	// engines asked in the id's order until the holder answers.
	engines[1].mu.Lock()
	engines[1].held["elsewhere"] = true
	engines[1].mu.Unlock()
	order := probeOrder("elsewhere", []string{"e0", "e1", "e2"}, "")
	want := 0
	for i, e := range order {
		if e == "e1" {
			want = i + 1
		}
	}
	before = count()
	st, rep, out = call(`{"model":"m","input":"x","previous_response_id":"elsewhere"}`)
	after := count()
	asked := after[0] + after[1] + after[2] - before[0] - before[1] - before[2]
	if st != 200 || rep != "e1" || asked != want {
		t.Fatalf("unknown id: %d on %s %s after %d requests, want e1 after %d (order %v)", st, rep, out, asked, want, order)
	}
	if st, _, out := call(`{"model":"m","input":"x","previous_response_id":"nobody"}`); st != 404 || !strings.Contains(out, "Response with id 'nobody' not found.") {
		t.Fatalf("held nowhere: %d %s", st, out)
	}

	// GET /v1/responses/{id} goes where a continuation goes.
	for id, want := range map[string]string{a.ID: "e2", "mine-1": "e0", "elsewhere": "e1"} {
		resp, err := rg.client.Get(rg.front.URL + responsesPath + "/" + id)
		if err != nil {
			t.Fatal(err)
		}
		if out := readAll(t, resp); resp.StatusCode != 200 || resp.Header.Get("X-Kvrouter-Replica") != want || !strings.Contains(out, id) {
			t.Errorf("GET %s: %d on %s %s, want %s", id, resp.StatusCode, resp.Header.Get("X-Kvrouter-Replica"), out, want)
		}
	}
	if resp, err := rg.client.Get(rg.front.URL + responsesPath + "/nobody"); err != nil || resp.StatusCode != 404 {
		t.Errorf("GET unknown: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	resp := rg.post(responsesPath, `{"model":"m","input":"hi","stream":true}`)
	if out := readAll(t, resp); resp.StatusCode != 200 || !strings.HasSuffix(out, "}}\n\n") || strings.Contains(out, "stopped") || strings.Contains(out, "ended the stream") {
		t.Fatalf("stream: %d %s", resp.StatusCode, out)
	}
	for _, e := range rg.engines { // an event stream without [DONE] is whole
		if n := rg.outcome(e.name, outcomeUpstream); n != 0 {
			t.Errorf("%s: %v upstream errors", e.name, n)
		}
	}
	rg.fleet.Report(rg.fleet.Endpoint("e2"), fleet.OutcomeConnError)
	if st, _, out := call(`{"model":"m","input":"more","previous_response_id":"` + a.ID + `"}`); st != 503 || !strings.Contains(out, `"service_unavailable_error"`) {
		t.Fatalf("holder unhealthy: %d %s", st, out)
	}
}
