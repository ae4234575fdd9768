package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/structpb"

	"kvrouter/internal/config"
	"kvrouter/internal/epp"
	"kvrouter/internal/serve"
)

// fakeEnvoy drives the ext_proc exchange as Envoy's ext_proc filter does in
// FULL_DUPLEX_STREAMED mode for request and response (the Endpoint Picker
// Protocol's streaming mode), and forwards the request to the picked
// engine over HTTP itself, the gateway's part. The upstream project's
// integration tests drive its EPP with such a client rather than a real
// Envoy.
type fakeEnvoy struct {
	t    testing.TB
	conn *grpc.ClientConn
	ext  extprocv3.ExternalProcessorClient
	http *http.Client
}

func newFakeEnvoy(t testing.TB, addr string) *fakeEnvoy {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	hc := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(hc.CloseIdleConnections)
	return &fakeEnvoy{t: t, conn: conn, ext: extprocv3.NewExternalProcessorClient(conn), http: hc}
}

// envoyReq is one request through the fake gateway.
type envoyReq struct {
	method, path string
	body         []byte
	chunk        int      // request body chunk size (default 16 KiB)
	subset       []string // subset hint (nil: none; non-nil empty: an empty list)
	// serveAt, when set, picks the endpoint the gateway sends to (its
	// retry went elsewhere) instead of the pick's first.
	serveAt func(dest string) string
	// cancelAfter, when positive, cancels the stream (the client left)
	// after that many response body chunks.
	cancelAfter int
}

// envoyResult is what the exchange produced.
type envoyResult struct {
	immediate   *extprocv3.ImmediateResponse
	setHeaders  map[string]string // request header mutations
	dest        string            // envoy.lb x-gateway-destination-endpoint
	served      string
	fwdBody     []byte // the request body after mutation
	status      int
	respHeaders map[string]string // response header mutations
	respBody    []byte            // response body as the EPP relayed it
	respChunks  int
	pickLatency time.Duration // request headers sent to the headers response received
}

func (r *envoyResult) String() string {
	if r.immediate != nil {
		return fmt.Sprintf("immediate %d %s", r.immediate.GetStatus().GetCode(), r.immediate.GetBody())
	}
	return fmt.Sprintf("dest %s status %d", r.dest, r.status)
}

func hdrs(kv ...string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return m
}

func setHeaderMap(set []*corev3.HeaderValueOption) map[string]string {
	out := map[string]string{}
	for _, o := range set {
		v := string(o.GetHeader().GetRawValue())
		if v == "" {
			v = o.GetHeader().GetValue()
		}
		out[strings.ToLower(o.GetHeader().GetKey())] = v
	}
	return out
}

// do runs one request. It fails the test on a protocol violation by the
// EPP (a response out of order).
func (e *fakeEnvoy) do(ctx context.Context, r envoyReq) *envoyResult {
	e.t.Helper()
	if r.method == "" {
		r.method = http.MethodPost
	}
	if r.chunk == 0 {
		r.chunk = 16 << 10
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := e.ext.Process(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	res := &envoyResult{}
	md := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{}}
	if r.subset != nil {
		vals := make([]any, len(r.subset))
		for i, s := range r.subset {
			vals[i] = s
		}
		s, _ := structpb.NewStruct(map[string]any{epp.SubsetKey: vals})
		md.FilterMetadata[epp.SubsetNamespace] = s
	}
	t0 := time.Now()
	send := func(m *extprocv3.ProcessingRequest) {
		if err := st.Send(m); err != nil {
			e.t.Fatalf("send: %v", err)
		}
	}
	send(&extprocv3.ProcessingRequest{MetadataContext: md, Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers:     hdrs(":method", r.method, ":path", r.path, ":authority", "gw", "content-type", "application/json", "content-length", strconv.Itoa(len(r.body))),
		EndOfStream: len(r.body) == 0,
	}}})
	for off := 0; off < len(r.body); off += r.chunk {
		end := min(off+r.chunk, len(r.body))
		send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: r.body[off:end], EndOfStream: end == len(r.body)}}})
	}
	// Request headers response, then the body chunks until end of stream.
	m, err := st.Recv()
	if err != nil {
		e.t.Fatalf("recv headers response: %v", err)
	}
	res.pickLatency = time.Since(t0)
	if im := m.GetImmediateResponse(); im != nil {
		res.immediate = im
		return res
	}
	hr := m.GetRequestHeaders()
	if hr == nil {
		e.t.Fatalf("first response is %T, want request headers", m.GetResponse())
	}
	res.setHeaders = setHeaderMap(hr.GetResponse().GetHeaderMutation().GetSetHeaders())
	res.dest = m.GetDynamicMetadata().GetFields()[epp.DestinationNamespace].GetStructValue().GetFields()[epp.DestinationKey].GetStringValue()
	if len(r.body) > 0 {
		for {
			m, err := st.Recv()
			if err != nil {
				e.t.Fatalf("recv body response: %v", err)
			}
			sb := m.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
			if sb == nil {
				e.t.Fatalf("got %T, want a streamed request body", m.GetResponse())
			}
			res.fwdBody = append(res.fwdBody, sb.GetBody()...)
			if sb.GetEndOfStream() {
				break
			}
		}
	}
	// The gateway's part: forward to the endpoint.
	target := strings.Split(res.dest, ",")[0]
	if r.serveAt != nil {
		target = r.serveAt(res.dest)
	}
	res.served = target
	hreq, _ := http.NewRequestWithContext(ctx, r.method, "http://"+target+r.path, bytes.NewReader(res.fwdBody))
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := e.http.Do(hreq)
	if err != nil {
		e.t.Fatalf("forward to %s: %v", target, err)
	}
	defer resp.Body.Close()
	res.status = resp.StatusCode
	smd, _ := structpb.NewStruct(map[string]any{epp.ServedKey: target})
	send(&extprocv3.ProcessingRequest{
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{epp.DestinationNamespace: smd}},
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: hdrs(":status", strconv.Itoa(resp.StatusCode), "content-type", resp.Header.Get("Content-Type")),
		}},
	})
	m, err = st.Recv()
	if err != nil {
		e.t.Fatalf("recv response headers response: %v", err)
	}
	if m.GetResponseHeaders() == nil {
		e.t.Fatalf("got %T, want response headers", m.GetResponse())
	}
	res.respHeaders = setHeaderMap(m.GetResponseHeaders().GetResponse().GetHeaderMutation().GetSetHeaders())
	buf := make([]byte, 32<<10)
	for {
		n, rerr := resp.Body.Read(buf)
		eos := errors.Is(rerr, io.EOF)
		if rerr != nil && !eos {
			e.t.Fatalf("engine body: %v", rerr)
		}
		if n == 0 && !eos {
			continue
		}
		send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: bytes.Clone(buf[:n]), EndOfStream: eos}}})
		m, err := st.Recv()
		if err != nil {
			e.t.Fatalf("recv response body: %v", err)
		}
		sb := m.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sb == nil {
			e.t.Fatalf("got %T, want a streamed response body", m.GetResponse())
		}
		res.respBody = append(res.respBody, sb.GetBody()...)
		res.respChunks++
		if r.cancelAfter > 0 && res.respChunks >= r.cancelAfter {
			cancel() // the client left: Envoy resets the stream
			return res
		}
		if eos {
			break
		}
	}
	_ = st.CloseSend()
	if _, err := st.Recv(); err != io.EOF {
		e.t.Errorf("after the exchange: %v, want the stream to end", err)
	}
	return res
}

// eppStack is kvrouter epp in this process: gRPC and HTTP on loopback.
type eppStack struct {
	grpc, url string
	envoy     *fakeEnvoy
	ctx       context.Context // ends with the test
}

// eppFlags are what startEPP builds kvrouter epp from: the router's
// options and the picker's configuration.
type eppFlags struct {
	serve serve.Options
	epp   epp.Config
}

// startEPP runs kvrouter epp with router.yaml text and waits until the
// gRPC readiness check serves; opts change the flags before the build.
func startEPP(t testing.TB, yaml string, maxInFlight int64, opts ...func(*eppFlags)) *eppStack {
	t.Helper()
	skipE2EShort(t)
	cfg, pos, err := config.Parse([]byte(yaml), func(string) string { return "" })
	if err != nil {
		t.Fatalf("%v\n%s", err, yaml)
	}
	log := slog.New(slog.DiscardHandler)
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	fl := &eppFlags{serve: serve.Options{Config: cfg, Positions: pos}, epp: epp.Config{MaxInFlight: maxInFlight, DrainTimeout: 5 * time.Second}}
	for _, o := range opts {
		o(fl)
	}
	fl.serve.Log = log
	app, err := serve.New(t.Context(), fl.serve)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.RunEPP(ctx, fl.epp, ln, gln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("epp: %v", err)
		}
	})
	s := &eppStack{grpc: gln.Addr().String(), url: "http://" + ln.Addr().String(), ctx: t.Context()}
	s.envoy = newFakeEnvoy(t, s.grpc)
	return s
}

// configOptions are the router's options as kvrouter serve or epp --config
// path --config-poll poll --listen listen builds them: the file parsed,
// polled for changes, and the listen address over the file's.
func configOptions(t testing.TB, path string, poll time.Duration, listen string) serve.Options {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	env := func(string) string { return "" }
	cfg, pos, err := config.Parse(data, env)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	override := func(c *config.Config) { c.Listen = listen }
	override(&cfg)
	return serve.Options{Config: cfg, Positions: pos, ConfigPath: path, ConfigHash: sha256.Sum256(data), Getenv: env, Poll: poll, Override: override}
}

// health asks the EPP's gRPC health service.
func (s *eppStack) health(t testing.TB, service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	r, err := healthpb.NewHealthClient(s.envoy.conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	return r.GetStatus(), err
}

func (s *eppStack) waitReady(t testing.TB) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if st, err := s.health(t, epp.HealthReadiness); err == nil && st == healthpb.HealthCheckResponse_SERVING {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("epp readiness not SERVING within 60 s")
		}
	}
}

// eppYAML is a router.yaml for model m on the sims.
func eppYAML(extra string, sims ...*e2eSim) string {
	var b strings.Builder
	b.WriteString("health: {probe_interval: 200ms, scrape_interval: 200ms, backoff_base: 30s, backoff_max: 60s}\n" + extra + "models:\n  - name: m\n    tokenizer: " + e2eQwen3Dir + "\n    routing: {prefill_rate: 20000}\n    engines:\n")
	for i, s := range sims {
		fmt.Fprintf(&b, "      - {name: e%d, url: %q", i, s.url)
		if s.events != "" {
			fmt.Fprintf(&b, ", events: %q, replay: %q", s.events, s.replay)
		}
		b.WriteString("}\n")
	}
	return b.String()
}
