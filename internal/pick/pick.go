package pick

import (
	"encoding/json"
	"fmt"
	"time"
)

// Input is one request as a gateway saw it.
type Input struct {
	// Path is the request's :path ("/v1/chat/completions?x=1" is read as
	// "/v1/chat/completions").
	Path string
	// Header returns a request header's first value ("" when absent);
	// names are case-insensitive. Nil: no headers.
	Header func(name string) string
	// Body is the complete request body.
	Body []byte
	// RequestID is the request's x-request-id, or "" (one is made).
	RequestID string
	// Allow, when not nil, limits the candidates to the endpoints whose
	// address ("ip:port") it accepts: the gateway's subset hint.
	Allow func(addr string) bool
	// MaxInFlight, when positive, is the most requests an endpoint may
	// have open through this front; a request whose every candidate is
	// at it is shed (429).
	MaxInFlight int64
}

// Target is the engine a request goes to.
type Target struct {
	// Replica is the engine's name; Addr its "ip:port" (the URL's host
	// and port).
	Replica, Addr string
	// CachedTokens is the predicted prefix-cache hit on Replica, in tokens.
	CachedTokens int
	// APIKey is the engine's API key ("" when none).
	APIKey string
}

// Shadow is, in shadow mode (policy shadow), what the kv policy would have
// chosen for a request.
type Shadow struct {
	// Replica is the kv policy's choice.
	Replica string
	// CachedTokens is its predicted prefix-cache hit, in tokens.
	CachedTokens int
}

// Lease is the core's hold on a Pick's engine (its load and predicted
// blocks) until End. The core implements it; a front calls it through the
// Pick's methods.
type Lease interface {
	// Served moves the lease to the engine at addr when it is another of
	// the model's engines (to, moved); an address that is no engine of the
	// model ends the lease with an error.
	Served(addr string) (to Target, moved bool, err error)
	// Status records the engine's response status.
	Status(code int)
	// FirstByte records that the first response byte reached the client.
	FirstByte()
	// End releases the lease; idempotent.
	End(ok bool)
}

// Pick is one routed request: where it goes and the lease it holds there
// until End. Not safe for concurrent use (one gateway stream owns it);
// End is idempotent.
type Pick struct {
	// Model is the request's configured model.
	Model string
	// Target is the chosen engine.
	Target
	// Fallbacks are the next endpoints' addresses in the router's order
	// (the model's Retries of them at most), for the gateway's retries.
	Fallbacks []string
	// Body is the body to send upstream (vllm_xargs.kv_cache_report_mode
	// merged in unless the model disables it).
	Body []byte
	// PromptTokens is the prompt's length in tokens, 0 when unknown.
	PromptTokens int
	// Tokenized tells whether the prompt's token ids were known.
	Tokenized bool
	// Stream is the request's "stream".
	Stream bool
	// Decision is how long routing took (the router's Route calls).
	Decision time.Duration
	// Shadow, in shadow mode (policy shadow), is what the kv policy would
	// have chosen for this request when it was picked; nil otherwise. It is
	// set once, by the core: the fallbacks and Served do not change it.
	Shadow *Shadow
	// Lease holds the engine until End. Required.
	Lease Lease
}

// Served tells the pick which endpoint ("ip:port") the gateway sent the
// request to. When it is another of the model's engines, the lease and
// the predicted blocks move there (the pick's are dropped, the served
// engine's recorded) and the Target changes; moved reports that. An
// address that is no engine of the model ends the lease (nothing is known
// of where the request is) and returns an error.
func (pk *Pick) Served(addr string) (moved bool, err error) {
	to, moved, err := pk.Lease.Served(addr)
	if moved {
		pk.Target = to
	}
	return moved, err
}

// Status records the engine's response status: passive health (as the
// HTTP front reports every answer) and, for a status other than 2xx, the
// predicted blocks dropped at once.
func (pk *Pick) Status(code int) { pk.Lease.Status(code) }

// FirstByte records that the first response byte reached the client (the
// request moves from prefill to decode in the load model); once.
func (pk *Pick) FirstByte() { pk.Lease.FirstByte() }

// End releases the lease: ok when the engine answered 2xx and the whole
// response went through; otherwise the predicted blocks are dropped
// first. Idempotent: only the first call counts.
func (pk *Pick) End(ok bool) { pk.Lease.End(ok) }

// Error is a request the core answers itself, before any engine saw it:
// Status with Body, OpenAI's error JSON ({"error": {"message", "type",
// "param", "code"}}), the same body the HTTP front answers.
type Error struct {
	Status int
	Body   []byte
	// RetryAfter, when positive, is the Retry-After header value in whole
	// seconds (503 without a replica, 429).
	RetryAfter int
	// Outcome is a kvrouter_proxy_requests_total outcome (package
	// frontmetrics): bad_request, no_replica, upstream_error, or shed (429).
	Outcome string
	// Model is the configured model the request named, or "" (unknown or
	// unread): a bounded metric label.
	Model string
	// Err is the cause for the log line.
	Err error
}

// Error is the status and body, for logs.
func (e *Error) Error() string { return fmt.Sprintf("%d: %s", e.Status, e.Body) }

// OpenAI error types a router answers with, by status, when the caller of
// ErrorBody names none.
const (
	typeInvalidRequest     = "invalid_request_error"
	typeRateLimit          = "rate_limit_error"
	typeServer             = "server_error"
	typeServiceUnavailable = "service_unavailable_error"
)

// ErrorBody is OpenAI's error JSON, {"error": {"message", "type", "param",
// "code"}}, for status with message, type typ ("invalid_request_error",
// "service_unavailable_error", ...; "" picks the status's usual type) and
// the offending field param ("": null).
func ErrorBody(status int, typ, param, message string) []byte {
	if typ == "" {
		switch {
		case status == 503:
			typ = typeServiceUnavailable
		case status == 429:
			typ = typeRateLimit
		case status >= 500:
			typ = typeServer
		default:
			typ = typeInvalidRequest
		}
	}
	d := errorDetail{Message: message, Type: typ, Code: status}
	if param != "" {
		d.Param = &param
	}
	b, _ := json.Marshal(errorBody{Error: d}) // cannot fail: strings and ints
	return b
}

// errorBody is OpenAI's error JSON.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}
