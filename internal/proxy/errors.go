package proxy

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"kvrouter/internal/pick"
	"kvrouter/internal/request"
)

// Error types: the one vocabulary of the "type" field of every error the
// router itself answers (OpenAI's names; docs/serve.md lists which status
// gets which). Errors an engine answers are relayed as they are.
const (
	typeInvalidRequest     = "invalid_request_error"     // 400, 405, 413, 415
	typeAuthentication     = "authentication_error"      // 401
	typeNotFound           = "not_found_error"           // 404: unknown model or path
	typeServer             = "server_error"              // 500, 502, 504, a stream broken mid-way
	typeServiceUnavailable = "service_unavailable_error" // 503: no replica up
	// typeVLLMBadRequest is vLLM's own type, for the one check the router
	// makes on the engine's behalf (a prompt over max_model_len), so that
	// clients and gateways see what the engine would have answered.
	typeVLLMBadRequest = "BadRequestError"
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
	switch e.Type {
	case request.UnknownModel:
		return &apiError{status: http.StatusNotFound, typ: typeNotFound, param: e.Param, message: e.Message}
	case request.PromptTooLong:
		return &apiError{status: http.StatusBadRequest, typ: typeVLLMBadRequest, param: e.Param, message: e.Message}
	}
	return badRequest(e.Param, e.Message)
}

// isNull reports whether raw is absent or JSON null.
func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || string(bytes.TrimSpace(raw)) == "null"
}

// maxMessage bounds an error message, in bytes: a safety net behind the
// cut of each echoed input (maxEcho).
const maxMessage = 4 << 10

// body is e in OpenAI's error JSON (pick.ErrorBody), the message cut at
// maxMessage.
func (e *apiError) body() []byte {
	return pick.ErrorBody(e.status, e.typ, e.param, truncate(e.message, maxMessage))
}

// write answers e. Only callable before the response headers are written.
func (e *apiError) write(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if e.retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(retryAfterSeconds(e.retryAfter)))
	}
	w.WriteHeader(e.status)
	_, _ = w.Write(e.body())
}

// retryAfterSeconds is d as a Retry-After value: whole seconds, rounded
// up (0 for none).
func retryAfterSeconds(d time.Duration) int {
	if d <= 0 {
		return 0
	}
	return int((d + time.Second - 1) / time.Second)
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
