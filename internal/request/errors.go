package request

// Type is the kind of a request error, from one small vocabulary that each
// front maps to its own answer (the HTTP front: a status and OpenAI's error
// JSON).
type Type uint8

// Error types.
const (
	// InvalidRequest: the body is malformed or a field has a wrong type or
	// value (HTTP 400, OpenAI's invalid_request_error).
	InvalidRequest Type = iota + 1
)

// Error is a request the router refuses, as parsed: what kind of problem,
// the offending field and a message fit to answer the client with.
type Error struct {
	// Type is what went wrong.
	Type Type
	// Param is the offending request field ("messages[0].role"), or "".
	Param string
	// Message is the client-facing text: names the field, echoes no more
	// than it needs of the input.
	Message string
}

// Error returns the message.
func (e *Error) Error() string { return e.Message }

func badRequest(param, msg string) *Error {
	return &Error{Type: InvalidRequest, Param: param, Message: msg}
}
