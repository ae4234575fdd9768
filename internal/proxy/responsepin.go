package proxy

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"kvrouter/internal/admission"
	"kvrouter/internal/fleet"
	"kvrouter/internal/request"
)

// Pinning previous_response_id to the engine that holds the response.
//
// vLLM keeps a stored response in the memory of the API server process
// that answered it (responses.go), so a request continuing it must reach
// that engine, whichever router replica it arrives at, also after a router
// restart, without state shared between router replicas. Three sources, in
// order:
//
//  1. The id names its engine. When the client sets no request_id, the
//     router sets it, and vLLM makes it the response's id: "resp_kvr1" +
//     the engine's name in lower-case base32 (no padding) + "_" + 32
//     random hex digits. Any router replica decodes the engine from the
//     id alone. Such a request goes to that engine only: while it is
//     unhealthy the answer is a 503 (the state is there, come back); the
//     engine's own 404 is relayed when it lost the state (restart, store
//     off). Limits: the engine's name is readable in the id (base32 is no
//     secret), and an engine renamed in the configuration or by discovery
//     is looked for as in 3.
//  2. An id the client chose (its request_id) is learned from the answer:
//     the engine that answered 2xx is remembered, in this router replica's
//     memory only (the last maxLearnedResponses ids).
//  3. Otherwise (another router replica or a restart for a client-chosen
//     id; an engine renamed), the healthy engines are asked in an order
//     fixed by the id (highest FNV-1a of id + engine first, so every router
//     replica asks in the same order), moving on while they answer 404,
//     nothing having reached the client: at most one request per engine.
//     The last 404 is relayed.
//
// With --api-server-count above 1, vLLM itself has one store per API server
// process behind one port, and a continuation finds its response only when
// it reaches the same process: no router can fix that (run one API server
// per engine to use previous_response_id).

// maxLearnedResponses bounds the client-chosen response ids remembered.
const maxLearnedResponses = 1 << 16

// respTag starts a response id the router chose.
const respTag = "resp_kvr1"

// respEncoding is base32 in lower case without padding (ids stay
// [a-z0-9_]).
func respEncoding() *base32.Encoding {
	return base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)
}

// mintResponseID returns a new response id naming engine.
func mintResponseID(engine string) string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return respTag + respEncoding().EncodeToString([]byte(engine)) + "_" + hex.EncodeToString(b[:])
}

// responseEngine decodes the engine's name from an id mintResponseID made;
// ok is false for any other id.
func responseEngine(id string) (engine string, ok bool) {
	rest, ok := strings.CutPrefix(id, respTag)
	if !ok {
		return "", false
	}
	i := strings.LastIndexByte(rest, '_')
	if i <= 0 || len(rest)-i-1 != 32 {
		return "", false
	}
	if _, err := hex.DecodeString(rest[i+1:]); err != nil {
		return "", false
	}
	b, err := respEncoding().DecodeString(rest[:i])
	if err != nil || len(b) == 0 {
		return "", false
	}
	return string(b), true
}

// learnedResponses maps client-chosen response ids to the engine that
// answered them, the oldest forgotten first. Safe for concurrent use.
type learnedResponses struct {
	mu   sync.Mutex
	m    map[string]string
	ring []string // ids in insertion order, a ring of cap maxLearnedResponses
	next int
}

func (l *learnedResponses) put(id, engine string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string]string{}
	}
	if _, ok := l.m[id]; ok {
		l.m[id] = engine
		return
	}
	if len(l.ring) < maxLearnedResponses {
		l.ring = append(l.ring, id)
	} else {
		delete(l.m, l.ring[l.next])
		l.ring[l.next] = id
		l.next = (l.next + 1) % maxLearnedResponses
	}
	l.m[id] = engine
}

func (l *learnedResponses) get(id string) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.m[id]
	return e, ok
}

// pinFeature serves the Responses API's state: a request continuing a
// stored response goes to the engine holding it (or probes for it), and a
// response id the client chose is remembered with its engine (hooks plan,
// engines, body, retry, end).
type pinFeature struct{ s *Server }

// Admit does nothing: pinning is the HTTP front's (plug).
func (pinFeature) Admit(context.Context, *admission.Flow) *request.Error { return nil }

// plug plugs pinResponse in as x's plan when x is a Responses request.
func (f pinFeature) plug(_ context.Context, x *exchange, _ *model) {
	if x.Req.Kind == request.Responses {
		x.hooks.addPlan(f.s.pinResponse)
	}
}

// responsePin is the engine order of a request continuing a stored
// response: attempt i goes to order[i].
type responsePin struct {
	id    string
	order []string
}

// pinResponse prepares x's forwarding: the router's request_id when the
// client set none, and for a previous_response_id the engines to ask. It
// answers the error itself and returns false when x cannot be forwarded.
func (s *Server) pinResponse(_ context.Context, x *exchange) bool {
	rf := x.Req.Responses
	if rf.RequestID == "" {
		fwd := x.Fwd
		x.hooks.body = func(engine string) []byte { return withRequestID(fwd, mintResponseID(engine)) }
	} else {
		x.hooks.addEnd(func(x *exchange, attrs []slog.Attr) []slog.Attr {
			s.learnResponse(x)
			return attrs
		})
	}
	if rf.PrevID == "" {
		return true
	}
	x.Tokens = nil // the prompt starts with history only the engine holds
	eps, retry, err := s.healthy(nil, x)
	healthy := names(eps)
	hint, tagged := responseEngine(rf.PrevID)
	if !tagged {
		hint, _ = s.learned.get(rf.PrevID)
	}
	p := &responsePin{id: rf.PrevID}
	switch {
	case tagged && s.deps.Fleet.Endpoint(hint) != nil:
		if !slices.Contains(healthy, hint) {
			s.fail(x, &apiError{status: http.StatusServiceUnavailable, typ: typeServiceUnavailable, retryAfter: max(retry, time.Second),
				message: fmt.Sprintf("replica %s, which holds response %q, is not healthy", hint, rf.PrevID)}, outcomeNoReplica)
			x.err = err
			return false
		}
		p.order = []string{hint}
	default:
		p.order = probeOrder(rf.PrevID, healthy, hint)
	}
	if len(p.order) == 0 {
		s.noReplica(x, retry, err)
		return false
	}
	// Attempt i goes to order[i]; another engine cannot hold the response:
	// move on only when this one answered 404 (or could not be reached).
	x.hooks.addEngines(func(eps []*fleet.Endpoint) ([]*fleet.Endpoint, error) {
		next := p.order[min(x.retries, len(p.order)-1)]
		return slices.DeleteFunc(eps, func(ep *fleet.Endpoint) bool { return ep.Name() != next }), nil
	})
	x.hooks.retry = func(attempt, status int) bool {
		return p.canProbe(attempt) && (status == 0 || status == http.StatusNotFound)
	}
	return true
}

// probeOrder orders engines for id: hint first when it is one of them,
// then by FNV-1a of id + "\x00" + engine, highest first (the same order on
// every router replica).
func probeOrder(id string, engines []string, hint string) []string {
	score := func(e string) uint64 {
		h := fnv.New64a()
		_, _ = h.Write([]byte(id + "\x00" + e))
		return h.Sum64()
	}
	out := slices.DeleteFunc(slices.Clone(engines), func(e string) bool { return e == hint })
	slices.SortFunc(out, func(a, b string) int {
		sa, sb := score(a), score(b)
		switch {
		case sa > sb:
			return -1
		case sa < sb:
			return 1
		}
		return strings.Compare(a, b)
	})
	if slices.Contains(engines, hint) {
		out = append([]string{hint}, out...)
	}
	return out
}

// canProbe reports whether attempt (0-based) of x may be followed by
// another: only while x's pin has engines left.
func (p *responsePin) canProbe(attempt int) bool { return attempt < len(p.order)-1 }

// learnResponse remembers which engine answered a client-chosen response
// id.
func (s *Server) learnResponse(x *exchange) {
	if x.Req == nil || x.Req.Responses == nil || x.Req.Responses.RequestID == "" || x.status/100 != 2 || x.replica == "" {
		return
	}
	s.learned.put(x.Req.Responses.RequestID, x.replica)
}

// withRequestID returns body (a JSON object ending in '}', without a
// request_id) with "request_id": id added last.
func withRequestID(body []byte, id string) []byte {
	i := len(body) - 1
	for i >= 0 && body[i] != '}' {
		i--
	}
	out := make([]byte, 0, len(body)+len(id)+20)
	out = append(out, body[:i]...)
	out = append(out, `,"request_id":"`...)
	out = append(out, id...) // [a-z0-9_]: no escaping
	out = append(out, `"}`...)
	return out
}
