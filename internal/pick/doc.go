// Package pick is the contract between kvrouter's routing core and a front
// that does not forward requests itself (the Gateway API Inference
// Extension endpoint picker, package epp): the request as the gateway saw
// it (Input), where to send it and the load lease held there until the
// answer ends (Pick, Lease), or the answer the core gives instead (Error,
// with OpenAI's error JSON, ErrorBody).
//
// The core (package proxy's Picker) fills these in; the front only reads
// them and reports back through a Pick's methods. Token counts are
// tokens. The package holds no state and starts no goroutines; a Pick
// belongs to one gateway stream and is not safe for concurrent use.
package pick
