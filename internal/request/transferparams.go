package request

import (
	"bytes"
	"encoding/json"

	"github.com/ardanlabs/jinja"
)

// mayNameTransferParams reports whether body holds "kv_transfer_params"
// or a \u escape (which could spell it). The name is looked for by its
// "_transfer_params" part: bytes.Index restarts its byte search at every
// occurrence of the pattern's first byte, and a 'k' occurs every hundred
// or so bytes of prose, an '_' seldom.
func mayNameTransferParams(body []byte) bool {
	for i := 0; ; i++ {
		j := bytes.Index(body[i:], []byte("_transfer_params"))
		if j < 0 {
			break
		}
		if i += j; i >= 2 && body[i-2] == 'k' && body[i-1] == 'v' {
			return true
		}
	}
	return bytes.Contains(body, []byte(`\u`))
}

// HasTransferParams serves the refusal of a client's kv_transfer_params,
// vLLM's request field that directs a KV connector (prefill/decode
// disaggregation: where to push or pull a prompt's KV), which the router
// sets itself. It reports whether the JSON object body has a top-level
// kv_transfer_params that is not null (vLLM's default), or one inside a
// top-level vllm_xargs object, its key compared
// after unescaping as vLLM's pydantic reads it. body is valid JSON
// (Parse checked it); anything else reports false. It walks the
// top level only, skipping nested values and strings with IndexByte, so
// it costs a fraction of a decode.
func HasTransferParams(body []byte) bool {
	if !mayNameTransferParams(body) {
		return false
	}
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return false
	}
	i++
	for {
		i = skipSpace(body, i)
		if i >= len(body) || body[i] != '"' {
			return false // '}' or malformed
		}
		end := stringEnd(body, i)
		if end < 0 {
			return false
		}
		raw := body[i : end+1]
		i = skipSpace(body, end+1)
		if i >= len(body) || body[i] != ':' {
			return false
		}
		i = skipSpace(body, i+1)
		v := i
		if i = valueEnd(body, i); i < 0 {
			return false
		}
		if keyIs(raw, "kv_transfer_params") {
			return !bytes.Equal(body[v:i], []byte("null"))
		}
		// vLLM copies vllm_xargs into SamplingParams.extra_args, where a
		// top-level kv_transfer_params goes too (the KV connector reads it
		// there), so the key is refused inside vllm_xargs as well.
		if keyIs(raw, "vllm_xargs") && body[v] == '{' && HasTransferParams(body[v:i]) {
			return true
		}
		i = skipSpace(body, i)
		if i >= len(body) || body[i] != ',' {
			return false
		}
		i++
	}
}

// HasTransferParams is HasTransferParams(r.Body), read from the body's
// decoded document when Parse kept one (a chat body), which saves a scan
// of the body: the same keys in the same order, unescaped, the first
// kv_transfer_params deciding (a kept document has no repeated key).
func (r *Parsed) HasTransferParams() bool {
	if r.doc == nil {
		return HasTransferParams(r.Body)
	}
	for _, f := range r.doc.Fields {
		switch f.Key {
		case "kv_transfer_params":
			return !f.Value.IsNone()
		case "vllm_xargs":
			if f.Value.IsDict() && dictHasTransferParams(f.Value.AsDict()) {
				return true
			}
		}
	}
	return false
}

// dictHasTransferParams is HasTransferParams for a decoded object.
func dictHasTransferParams(d *jinja.Dict) bool {
	for _, k := range d.Keys {
		v := d.Data[k]
		switch k {
		case "kv_transfer_params":
			return !v.IsNone()
		case "vllm_xargs":
			if v.IsDict() && dictHasTransferParams(v.AsDict()) {
				return true
			}
		}
	}
	return false
}

// keyIs reports whether the JSON string raw (quotes included) is want,
// compared after unescaping.
func keyIs(raw []byte, want string) bool {
	return string(raw[1:len(raw)-1]) == want || bytes.IndexByte(raw, '\\') >= 0 && unquotes(raw, want)
}

// unquotes reports whether the JSON string raw (quotes included) decodes to
// want.
func unquotes(raw []byte, want string) bool {
	var s string
	return json.Unmarshal(raw, &s) == nil && s == want
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index of the quote closing the string that starts
// at b[i] (a quote), or -1: the next quote preceded by an even number of
// backslashes.
func stringEnd(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return -1
		}
		j += k
		n := 0
		for n < j-i-1 && b[j-1-n] == '\\' {
			n++
		}
		if n%2 == 0 {
			return j
		}
	}
	return -1
}

// valueEnd returns the index just past the JSON value starting at b[i], or
// -1.
func valueEnd(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		if e := stringEnd(b, i); e >= 0 {
			return e + 1
		}
		return -1
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				if j = stringEnd(b, j); j < 0 {
					return -1
				}
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\t' && b[j] != '\n' && b[j] != '\r' {
		j++
	}
	return j
}
