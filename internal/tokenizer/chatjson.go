package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
)

// chatShape is the top-level shape a chat request must have, for errors.
const chatShape = `a JSON object {"messages":[...], "tools":[...], "add_generation_prompt":true, "chat_template_kwargs":{...}}`

// chatJSONError says in JSON terms what a chat request body that
// encoding/json refused should have been, instead of naming Go types:
// "want a JSON object {...}, got an array", "add_generation_prompt: want
// true or false, got a string". Syntax errors pass through.
func chatJSONError(data []byte, err error) error {
	var te *json.UnmarshalTypeError
	if !errors.As(err, &te) {
		return err
	}
	got := jsonKindOf(bytes.TrimSpace(data))
	if te.Field == "" {
		if got == "an array" {
			return fmt.Errorf("want %s, got an array (a bare list of messages? wrap it as {\"messages\":[...]})", chatShape)
		}
		return fmt.Errorf("want %s, got %s", chatShape, got)
	}
	return fmt.Errorf("%s: want %s, got %s", te.Field, jsonKindFor(te.Type), jsonKindValue(te.Value))
}

// jsonKindOf names the kind of the JSON value v ("an array", "a string", ...).
func jsonKindOf(v []byte) string {
	if len(v) == 0 {
		return "nothing"
	}
	switch v[0] {
	case '[':
		return "an array"
	case '{':
		return "an object"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// jsonKindValue names the kind json.UnmarshalTypeError.Value describes
// ("array", "object", "string", "bool", "number" or "number 1.5").
func jsonKindValue(v string) string {
	switch v {
	case "array":
		return "an array"
	case "object":
		return "an object"
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	}
	return "a number"
}

// jsonKindFor names the JSON kind that decodes into t.
func jsonKindFor(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	}
	return "a number"
}
