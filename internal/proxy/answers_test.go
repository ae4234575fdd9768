package proxy

import (
	"bytes"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// TestMethodNotAllowed: a known path asked with another method is a 405
// naming the allowed methods in Allow, in OpenAI's error shape; an unknown
// path, or a known one with a slash percent-encoded, stays a 404.
func TestMethodNotAllowed(t *testing.T) {
	rg := newRig(t, 1)
	tests := []struct {
		method, path string
		status       int
		allow        string
	}{
		{http.MethodGet, "/v1/chat/completions", 405, "POST"},
		{http.MethodGet, "/v1/completions", 405, "POST"},
		{http.MethodPut, "/v1/route", 405, "POST"},
		{http.MethodPost, "/v1/models", 405, "GET, HEAD"},
		{http.MethodDelete, "/ready", 405, "GET, HEAD"},
		{http.MethodGet, "/v1/embeddings", 405, "POST"}, // passed through (POST) since issue 16
		{http.MethodGet, "/v1/no-such-endpoint", 404, ""},
		{http.MethodPost, "/v1/chat%2Fcompletions", 404, ""}, // an encoded slash names no known path
		{http.MethodGet, "/v1%2Fmodels", 404, ""},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, rg.front.URL+tt.path, nil)
			resp, err := rg.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body := readAll(t, resp)
			if resp.StatusCode != tt.status || resp.Header.Get("Allow") != tt.allow {
				t.Fatalf("%d Allow %q, want %d %q: %s", resp.StatusCode, resp.Header.Get("Allow"), tt.status, tt.allow, body)
			}
			e := errorOf(t, body)
			want := typeInvalidRequest
			if tt.status == 404 {
				want = typeNotFound
			}
			if e.Code != tt.status || e.Type != want {
				t.Errorf("error %+v, want code %d type %s", e, tt.status, want)
			}
		})
	}
}

// logBuffer is a concurrency-safe slog destination for tests.
type logBuffer struct {
	mu  chan struct{}
	buf bytes.Buffer
}

func newLogBuffer() *logBuffer { return &logBuffer{mu: make(chan struct{}, 1)} }

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu <- struct{}{}
	defer func() { <-b.mu }()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu <- struct{}{}
	defer func() { <-b.mu }()
	return b.buf.String()
}

// TestBadRequestModelLabel: a bad request is counted under the model it
// named when that model is configured and under "unknown" otherwise (no
// series per client-chosen name), and its log line names the model asked.
func TestBadRequestModelLabel(t *testing.T) {
	logs := newLogBuffer()
	rg := newRig(t, 1)
	srv, err := New(rg.srv.cfg, rg.srv.deps, slog.New(slog.NewTextHandler(logs, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	do := func(body string) {
		t.Helper()
		w := &recorder{header: http.Header{}}
		r, _ := http.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
		srv.Handler().ServeHTTP(w, r)
		if w.status != 400 && w.status != 404 {
			t.Fatalf("%s: status %d", body, w.status)
		}
	}
	do(`{"model":"m","messages":[]}`)                                           // configured model, bad messages
	do(`{"model":"nope-1","messages":[{"role":"user","content":"a"}]}`)         // unknown model
	do(`{"model":"nope-2","messages":[{"role":"user","content":"a"}]}`)         // another unknown model
	do(`{"messages":[{"role":"user","content":"a"}]}`)                          // no model
	do(`{"model":"` + strings.Repeat("x", 1000) + `","messages":"not a list"}`) // a long name
	if got := testutil.ToFloat64(srv.m.requests.WithLabelValues("m", "", outcomeBadRequest)); got != 1 {
		t.Errorf("model=m bad_request = %v, want 1", got)
	}
	if got := testutil.ToFloat64(srv.m.requests.WithLabelValues(modelUnknown, "", outcomeBadRequest)); got != 4 {
		t.Errorf("model=unknown bad_request = %v, want 4", got)
	}
	// No series for a client-chosen name: only m's and unknown's.
	ch := make(chan prometheus.Metric, 64)
	srv.m.requests.Collect(ch)
	close(ch)
	for metric := range ch {
		var pb dto.Metric
		_ = metric.Write(&pb)
		for _, l := range pb.GetLabel() {
			if l.GetName() == "model" && l.GetValue() != "m" && l.GetValue() != modelUnknown {
				t.Errorf("a series for model %q", l.GetValue())
			}
		}
	}
	out := logs.String()
	for _, want := range []string{"model=m ", "model=nope-1 ", "model=nope-2 ", "model=unknown ", "model=" + strings.Repeat("x", 256) + "..."} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in the log:\n%s", want, out)
		}
	}
	if strings.Contains(out, `model="" `) || strings.Contains(out, "model= ") {
		t.Errorf("a log line with an empty model:\n%s", out)
	}
}

// recorder is a minimal http.ResponseWriter.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) WriteHeader(s int) {
	if r.status == 0 {
		r.status = s
	}
}
func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = 200
	}
	return r.body.Write(b)
}

// TestRouteInputRequestID: the router gets the request's id (the client's
// x-request-id, or the one made for it), so its log lines carry it.
func TestRouteInputRequestID(t *testing.T) {
	rg := newRig(t, 2)
	resp := rg.post("/v1/chat/completions", chatBody, "X-Request-Id", "client-id-1")
	readAll(t, resp)
	resp = rg.post("/v1/route", chatBody)
	made := resp.Header.Get("X-Request-Id")
	readAll(t, resp)
	rg.router.mu.Lock()
	defer rg.router.mu.Unlock()
	if len(rg.router.inputs) != 2 {
		t.Fatalf("%d routings", len(rg.router.inputs))
	}
	if got := rg.router.inputs[0].RequestID; got != "client-id-1" {
		t.Errorf("RequestID %q, want the client's", got)
	}
	if got := rg.router.inputs[1].RequestID; got == "" || got != made {
		t.Errorf("RequestID %q, want the made id %q", got, made)
	}
}
