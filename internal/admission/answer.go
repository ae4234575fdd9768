package admission

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"
	"unicode/utf8"

	"kvrouter/internal/pick"
	"kvrouter/internal/request"
)

// Error types: the one vocabulary of the "type" field of every error the
// router itself answers, on either front (OpenAI's names; docs/serve.md
// lists which status gets which). Errors an engine answers are relayed as
// they are.
const (
	TypeInvalidRequest     = "invalid_request_error"     // 400, 405, 413, 415
	TypeAuthentication     = "authentication_error"      // 401
	TypeNotFound           = "not_found_error"           // 404: unknown model or path
	TypeRateLimit          = "rate_limit_error"          // 429: a shed request
	TypeServer             = "server_error"              // 500, 502, 504, a stream broken mid-way
	TypeServiceUnavailable = "service_unavailable_error" // 503: no replica up
	// TypeVLLMBadRequest is vLLM's own type, for the one check the router
	// makes on the engine's behalf (a prompt over max_model_len), so that
	// clients and gateways see what the engine would have answered.
	TypeVLLMBadRequest = "BadRequestError"
)

// HTTP status codes the Picker answers with (RFC 9110; package admission
// does not import net/http).
const (
	statusBadRequest            = 400
	statusUnauthorized          = 401
	statusNotFound              = 404
	statusRequestEntityTooLarge = 413
	statusTooManyRequests       = 429
	statusInternalServerError   = 500
	statusServiceUnavailable    = 503
)

// RequestStatus is the status and OpenAI type of the answer to a request
// refused before routing, by its request.Error type.
func RequestStatus(e *request.Error) (status int, typ string) {
	switch e.Type {
	case request.UnknownModel:
		return statusNotFound, TypeNotFound
	case request.PromptTooLong:
		return statusBadRequest, TypeVLLMBadRequest
	}
	return statusBadRequest, TypeInvalidRequest
}

// answer is an error the Picker answers in OpenAI's error shape.
type answer struct {
	status  int
	typ     string // one of the Type* constants
	param   string // the offending request field, or ""
	message string
	// retryAfter, when positive, is sent as Retry-After (whole seconds,
	// rounded up).
	retryAfter time.Duration
}

func (e *answer) Error() string { return e.message }

// body is e in OpenAI's error JSON (pick.ErrorBody), the message cut at
// MaxMessage.
func (e *answer) body() []byte {
	return pick.ErrorBody(e.status, e.typ, e.param, Truncate(e.message, MaxMessage))
}

func requestAnswer(e *request.Error) *answer {
	status, typ := RequestStatus(e)
	return &answer{status: status, typ: typ, param: e.Param, message: e.Message}
}

func serverAnswer(msg string) *answer {
	return &answer{status: statusInternalServerError, typ: TypeServer, message: msg}
}

// noReplica is the 503 of a request of model without a healthy replica,
// retry the fleet's hint for Retry-After (at least a second).
func noReplica(model string, retry time.Duration) *answer {
	return &answer{status: statusServiceUnavailable, typ: TypeServiceUnavailable,
		message: NoReplicaMessage(model), retryAfter: max(retry, time.Second)}
}

// NoReplicaMessage is the message of the 503 of a request of model
// without a healthy replica.
func NoReplicaMessage(model string) string {
	return fmt.Sprintf("no healthy replica for model %q", model)
}

// RetryAfterSeconds is d as a Retry-After value: whole seconds, rounded
// up (0 for none).
func RetryAfterSeconds(d time.Duration) int {
	if d <= 0 {
		return 0
	}
	return int((d + time.Second - 1) / time.Second)
}

// MaxEcho bounds, in bytes, the client input (a model name, a path) an
// error message repeats; longer input is cut with "...".
const MaxEcho = 256

// MaxMessage bounds an error message, in bytes: a safety net behind the
// cut of each echoed input (MaxEcho).
const MaxMessage = 4 << 10

// Truncate returns s cut to at most n bytes (on a rune boundary), "..."
// marking a cut.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "..."
}

// NewRequestID returns a random request id: 32 hex digits.
func NewRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}
