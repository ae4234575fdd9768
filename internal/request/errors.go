package request

// Type is the kind of a request error, from one small vocabulary that each
// front maps to its own answer (the HTTP front: a status and OpenAI's error
// JSON).
type Type uint8

// Error types.
const (
	// InvalidRequest: the body is malformed or a field has a wrong type or
	// value, or the request breaks a limit of its model group (HTTP 400,
	// OpenAI's invalid_request_error).
	InvalidRequest Type = iota + 1
	// UnknownModel: no model group, alias or adapter has the requested
	// model's name (HTTP 404, not_found_error).
	UnknownModel
	// PromptTooLong: the prompt and the requested output do not fit the
	// model's context length (HTTP 400 with vLLM's own BadRequestError
	// type, as the engine would answer).
	PromptTooLong
)

// Error is a request the router refuses before routing it: what kind of
// problem, the offending field and a message fit to answer the client
// with.
type Error struct {
	// Type is what went wrong.
	Type Type
	// Param is the offending request field ("messages[0].role"), or "".
	Param string
	// Message is the client-facing text: it names the field and echoes no
	// more of the input than it needs.
	Message string
}

// Error returns the message.
func (e *Error) Error() string { return e.Message }

// Invalid is an InvalidRequest error on param ("" for the body as a
// whole) with message msg.
func Invalid(param, msg string) *Error {
	return &Error{Type: InvalidRequest, Param: param, Message: msg}
}
