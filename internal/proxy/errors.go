package proxy

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"kvrouter/internal/admission"
	"kvrouter/internal/pick"
	"kvrouter/internal/request"
)

// Error types: admission's vocabulary (admission.TypeInvalidRequest ...),
// shared by both fronts.
const (
	typeInvalidRequest     = admission.TypeInvalidRequest
	typeAuthentication     = admission.TypeAuthentication
	typeNotFound           = admission.TypeNotFound
	typeServer             = admission.TypeServer
	typeServiceUnavailable = admission.TypeServiceUnavailable
)

// apiError is an error answered to the client in OpenAI's error shape:
// {"error": {"message", "type", "param", "code"}}.
type apiError struct {
	status  int
	typ     string // one of the type* constants
	param   string // the offending request field, or ""
	message string
	// retryAfter, when positive, is sent as Retry-After (whole seconds,
	// rounded up).
	retryAfter time.Duration
}

func (e *apiError) Error() string { return e.message }

func badRequest(param, msg string) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: typeInvalidRequest, param: param, message: msg}
}

// requestError is the answer to a request refused before routing: its
// request.Error type picks the status and OpenAI type, with the same
// param and message.
func requestError(e *request.Error) *apiError {
	status, typ := admission.RequestStatus(e)
	return &apiError{status: status, typ: typ, param: e.Param, message: e.Message}
}

// isNull reports whether raw is absent or JSON null.
func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || string(bytes.TrimSpace(raw)) == "null"
}

// body is e in OpenAI's error JSON (pick.ErrorBody), the message cut at
// admission.MaxMessage.
func (e *apiError) body() []byte {
	return pick.ErrorBody(e.status, e.typ, e.param, truncate(e.message, admission.MaxMessage))
}

// write answers e. Only callable before the response headers are written.
func (e *apiError) write(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if e.retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(admission.RetryAfterSeconds(e.retryAfter)))
	}
	w.WriteHeader(e.status)
	_, _ = w.Write(e.body())
}

// sseError is the event that ends a stream broken after its first byte:
// OpenAI clients raise an API error when an event's data has an "error" key.
func sseError(msg string, code int) []byte {
	b := pick.ErrorBody(code, typeServer, "", msg)
	out := make([]byte, 0, len(b)+8)
	out = append(out, "data: "...)
	out = append(out, b...)
	return append(out, "\n\n"...)
}

// serverError is a 500 of the router's own making.
func serverError(msg string) *apiError {
	return &apiError{status: http.StatusInternalServerError, typ: typeServer, message: msg}
}
