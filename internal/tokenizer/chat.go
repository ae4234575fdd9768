package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/ardanlabs/jinja"
)

// Chat errors callers branch on.
var (
	// ErrNoChatTemplate: the model's tokenizer_config.json has no
	// chat_template (or none that fits the request), so chats cannot be
	// rendered locally.
	ErrNoChatTemplate = errors.New("no chat template")
	// ErrUnsupported: the request uses something the local renderer does not
	// reproduce exactly (multimodal content parts, integers beyond int64);
	// ask the engine's render endpoint instead.
	ErrUnsupported = errors.New("not supported by the local renderer")
	// ErrBadChat: the chat request is malformed (bad JSON, wrong types,
	// unparsable tool-call arguments); vLLM answers such requests with 400.
	ErrBadChat = errors.New("malformed chat request")
)

// ChatRequest holds the fields of an OpenAI chat completion request that
// decide the prompt. Messages, Tools and ChatTemplateKwargs stay raw JSON so
// that object key order survives until rendering (templates print tools and
// tool-call arguments with tojson, which keeps insertion order).
type ChatRequest struct {
	// Messages is the JSON array of chat messages.
	Messages json.RawMessage `json:"messages"`
	// Tools is the JSON array of tool definitions; empty or null means none.
	Tools json.RawMessage `json:"tools,omitempty"`
	// AddGenerationPrompt appends the assistant header. When a ChatRequest
	// is decoded from JSON without this field it is true, vLLM's default.
	AddGenerationPrompt bool `json:"add_generation_prompt"`
	// ChatTemplateKwargs is a JSON object of extra template variables
	// (e.g. {"enable_thinking": false}); null or empty means none.
	ChatTemplateKwargs json.RawMessage `json:"chat_template_kwargs,omitempty"`
}

// UnmarshalJSON decodes a chat request body, defaulting
// add_generation_prompt to true as vLLM's ChatCompletionRequest does.
func (r *ChatRequest) UnmarshalJSON(data []byte) error {
	type plain ChatRequest
	p := plain{AddGenerationPrompt: true}
	if err := json.Unmarshal(data, &p); err != nil {
		return fmt.Errorf("%w: %v", ErrBadChat, err)
	}
	*r = ChatRequest(p)
	return nil
}

// ContentFormat says how message content reaches the template, as vLLM's
// --chat-template-content-format does.
type ContentFormat string

// Content formats.
const (
	// ContentAuto picks ContentOpenAI when the template loops over a
	// message's content, else ContentString (vLLM's "auto").
	ContentAuto ContentFormat = "auto"
	// ContentString flattens content to a string: null becomes "", a list of
	// text parts is joined with "\n".
	ContentString ContentFormat = "string"
	// ContentOpenAI hands content to the template as a list of
	// {"type":"text","text":...} parts; a plain string becomes one part.
	ContentOpenAI ContentFormat = "openai"
)

// ChatTemplateConfig configures NewChatTemplate.
type ChatTemplateConfig struct {
	// Source is tokenizer_config.json's chat_template: a JSON string, or a
	// JSON list of {"name", "template"} objects.
	Source json.RawMessage
	// BOSToken and EOSToken become the template variables bos_token and
	// eos_token; an empty string leaves the variable undefined, as
	// transformers does for a token set to null.
	BOSToken, EOSToken string
	// ContentFormat is how message content is handed to the template; zero
	// means ContentAuto.
	ContentFormat ContentFormat
	// Now is strftime_now's clock; nil means time.Now (local time, as the
	// engine's Python datetime.now()).
	Now func() time.Time
}

// ChatTemplate is a compiled chat template. Compile it once per model and
// reuse it: it is immutable and safe for concurrent use.
type ChatTemplate struct {
	byName   map[string]*jinja.Template
	single   *jinja.Template
	format   ContentFormat
	bos, eos jinja.Value
	strftime jinja.Value
}

// contentLoop finds a for-loop over a message's content, which is what
// vLLM's content-format detection looks for (it walks the Jinja AST; this
// matches the same loops written the usual ways).
var contentLoop = regexp.MustCompile(`\bfor\s+\w+\s+in\s+\w+(\.content\b|\[\s*['"]content['"]\s*\])`)

// NewChatTemplate compiles cfg.Source. It returns ErrNoChatTemplate when
// Source is empty or null, and a wrapped compile error naming the template
// otherwise.
func NewChatTemplate(cfg ChatTemplateConfig) (*ChatTemplate, error) {
	src := bytes.TrimSpace(cfg.Source)
	if len(src) == 0 || string(src) == "null" {
		return nil, ErrNoChatTemplate
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	c := &ChatTemplate{
		format:   cfg.ContentFormat,
		bos:      jinja.Undefined(),
		eos:      jinja.Undefined(),
		strftime: jinja.NewCallable("strftime_now", strftimeNow(now)),
	}
	if cfg.BOSToken != "" {
		c.bos = jinja.NewString(cfg.BOSToken)
	}
	if cfg.EOSToken != "" {
		c.eos = jinja.NewString(cfg.EOSToken)
	}
	var sources []string
	if src[0] == '"' {
		var s string
		if err := json.Unmarshal(src, &s); err != nil {
			return nil, fmt.Errorf("chat_template: %w", err)
		}
		t, err := jinja.Compile(s)
		if err != nil {
			return nil, fmt.Errorf("compile chat_template: %w", err)
		}
		c.single, sources = t, []string{s}
	} else {
		var named []struct {
			Name     string `json:"name"`
			Template string `json:"template"`
		}
		if err := json.Unmarshal(src, &named); err != nil {
			return nil, fmt.Errorf("chat_template: want a string or a list of {name, template}: %w", err)
		}
		c.byName = make(map[string]*jinja.Template, len(named))
		for _, n := range named {
			t, err := jinja.Compile(n.Template)
			if err != nil {
				return nil, fmt.Errorf("compile chat_template %q: %w", n.Name, err)
			}
			c.byName[n.Name] = t
			sources = append(sources, n.Template)
		}
		if len(c.byName) == 0 {
			return nil, ErrNoChatTemplate
		}
	}
	if c.format == "" || c.format == ContentAuto {
		c.format = ContentString
		for _, s := range sources {
			if contentLoop.MatchString(s) {
				c.format = ContentOpenAI
			}
		}
	}
	if c.format != ContentString && c.format != ContentOpenAI {
		return nil, fmt.Errorf("content format %q: want auto, string or openai", cfg.ContentFormat)
	}
	return c, nil
}

// ContentFormat reports the content format in use (never ContentAuto).
func (c *ChatTemplate) ContentFormat() ContentFormat { return c.format }

// pick chooses the template as transformers does for a named list: "tool_use"
// when tools are given and it exists, else "default".
func (c *ChatTemplate) pick(hasTools bool) (*jinja.Template, error) {
	if c.single != nil {
		return c.single, nil
	}
	if hasTools {
		if t, ok := c.byName["tool_use"]; ok {
			return t, nil
		}
	}
	if t, ok := c.byName["default"]; ok {
		return t, nil
	}
	return nil, fmt.Errorf("%w: no \"default\" among the named templates", ErrNoChatTemplate)
}

// Render returns the prompt text for req, as transformers'
// apply_chat_template(tokenize=False) returns it after vLLM's message
// normalisation. Errors wrap ErrBadChat (malformed request), ErrUnsupported
// (use the engine's render endpoint), ErrNoChatTemplate, or carry the
// template's own error (raise_exception).
func (c *ChatTemplate) Render(req ChatRequest) (out string, err error) {
	vars, err := c.vars(req)
	if err != nil {
		return "", err
	}
	t, err := c.pick(vars["tools"].IsTruthy())
	if err != nil {
		return "", err
	}
	defer func() {
		// The engine's Values panic on kind mismatches it does not check;
		// user input must never crash the router.
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("render chat template: %v", r)
		}
	}()
	out, err = t.RenderValues(vars)
	if err != nil {
		return "", fmt.Errorf("render chat template: %w", err)
	}
	return out, nil
}

// vars builds the template context: special tokens, tools, documents and
// add_generation_prompt, then chat_template_kwargs over them (vLLM merges
// request kwargs last), then messages.
func (c *ChatTemplate) vars(req ChatRequest) (map[string]jinja.Value, error) {
	msgs, err := decodeJSONValue(req.Messages, "messages")
	if err != nil {
		return nil, err
	}
	if !msgs.IsList() {
		return nil, fmt.Errorf("%w: messages: want a list", ErrBadChat)
	}
	if err := normalizeMessages(msgs.AsList(), c.format); err != nil {
		return nil, err
	}
	tools := jinja.None()
	if t := bytes.TrimSpace(req.Tools); len(t) > 0 && string(t) != "null" {
		if tools, err = decodeJSONValue(t, "tools"); err != nil {
			return nil, err
		}
		if !tools.IsList() {
			return nil, fmt.Errorf("%w: tools: want a list", ErrBadChat)
		}
	}
	vars := map[string]jinja.Value{
		"strftime_now":          c.strftime,
		"tools":                 tools,
		"documents":             jinja.None(),
		"add_generation_prompt": jinja.NewBool(req.AddGenerationPrompt),
	}
	if !c.bos.IsUndefined() {
		vars["bos_token"] = c.bos
	}
	if !c.eos.IsUndefined() {
		vars["eos_token"] = c.eos
	}
	if k := bytes.TrimSpace(req.ChatTemplateKwargs); len(k) > 0 && string(k) != "null" {
		kw, err := decodeJSONValue(k, "chat_template_kwargs")
		if err != nil {
			return nil, err
		}
		if !kw.IsDict() {
			return nil, fmt.Errorf("%w: chat_template_kwargs: want an object", ErrBadChat)
		}
		d := kw.AsDict()
		for _, key := range d.Keys {
			switch key {
			case "chat_template", "tokenize", "messages":
				return nil, fmt.Errorf("%w: chat_template_kwargs may not set %q", ErrBadChat, key)
			}
			vars[key] = d.Data[key]
		}
	}
	vars["messages"] = msgs
	return vars, nil
}

// normalizeMessages applies vLLM's parse_chat_messages changes in place:
// content flattened or wrapped per the content format, "reasoning" mirrored
// to "reasoning_content", empty tool_calls dropped and tool-call arguments
// given as JSON strings parsed into objects (vLLM _postprocess_messages).
// Other keys pass through in their order, as transformers passes them.
func normalizeMessages(msgs *jinja.List, format ContentFormat) error {
	for i, m := range msgs.Items {
		if !m.IsDict() {
			return fmt.Errorf("%w: messages[%d]: want an object", ErrBadChat, i)
		}
		d := m.AsDict()
		role, ok := d.Get("role")
		if !ok || !role.IsString() {
			return fmt.Errorf("%w: messages[%d].role: want a string", ErrBadChat, i)
		}
		content, err := normalizeContent(d.Data["content"], format)
		if err != nil {
			return fmt.Errorf("messages[%d].content: %w", i, err)
		}
		d.Set("content", content)
		if role.AsString() != "assistant" {
			continue
		}
		if r, ok := d.Get("reasoning"); ok && r.IsString() && !d.Has("reasoning_content") {
			d.Set("reasoning_content", r)
		}
		calls, ok := d.Get("tool_calls")
		if !ok || !calls.IsList() {
			continue
		}
		if calls.AsList().Len() == 0 {
			deleteKey(d, "tool_calls")
			continue
		}
		for j, call := range calls.AsList().Items {
			if err := normalizeToolCall(call); err != nil {
				return fmt.Errorf("messages[%d].tool_calls[%d]: %w", i, j, err)
			}
		}
	}
	return nil
}

// normalizeToolCall parses a string function.arguments into its JSON value
// and turns a missing, null or empty one into {}. Calls without a
// "function" object (which vLLM rejects) are left for the template.
func normalizeToolCall(call jinja.Value) error {
	if !call.IsDict() {
		return nil
	}
	fn, ok := call.AsDict().Get("function")
	if !ok || !fn.IsDict() {
		return nil
	}
	f := fn.AsDict()
	args := f.Data["arguments"]
	switch {
	case !args.IsTruthy():
		f.Set("arguments", jinja.NewDict())
	case args.IsString():
		v, err := decodeJSONValue([]byte(args.AsString()), "function.arguments")
		if err != nil {
			return err
		}
		f.Set("arguments", v)
	}
	return nil
}

// normalizeContent returns a message's content as the template sees it.
func normalizeContent(v jinja.Value, format ContentFormat) (jinja.Value, error) {
	var texts []string
	switch {
	case v.IsUndefined() || v.IsNone():
	case v.IsString():
		texts = []string{v.AsString()}
	case v.IsList():
		for i, p := range v.AsList().Items {
			t, ok, err := partText(p)
			if err != nil {
				return v, fmt.Errorf("part %d: %w", i, err)
			}
			if ok {
				texts = append(texts, t)
			}
		}
	default:
		return v, fmt.Errorf("%w: want a string, a list of parts or null", ErrBadChat)
	}
	if format == ContentString {
		return jinja.NewString(strings.Join(texts, "\n")), nil
	}
	parts := make([]jinja.Value, len(texts))
	for i, t := range texts {
		d := jinja.NewDict()
		d.AsDict().Set("type", jinja.NewString("text"))
		d.AsDict().Set("text", jinja.NewString(t))
		parts[i] = d
	}
	return jinja.NewList(parts), nil
}

// partText extracts the text of one content part; ok is false for a text
// part whose text is null (vLLM skips those). Non-text parts are
// ErrUnsupported: their placeholders and ids come from the engine.
func partText(p jinja.Value) (text string, ok bool, err error) {
	if p.IsString() {
		return p.AsString(), true, nil
	}
	if !p.IsDict() {
		return "", false, fmt.Errorf("%w: want an object", ErrBadChat)
	}
	d := p.AsDict()
	typ, _ := d.Get("type")
	key := "text"
	switch {
	case !typ.IsString():
		return "", false, fmt.Errorf("%w: content part without a type", ErrUnsupported)
	case typ.AsString() == "refusal":
		key = "refusal"
	case typ.AsString() == "thinking":
		key = "thinking"
	case typ.AsString() == "text", typ.AsString() == "input_text", typ.AsString() == "output_text":
	default:
		return "", false, fmt.Errorf("%w: content part of type %q", ErrUnsupported, typ.AsString())
	}
	t, _ := d.Get(key)
	switch {
	case t.IsUndefined() || t.IsNone():
		return "", false, nil
	case t.IsString():
		return t.AsString(), true, nil
	}
	return "", false, fmt.Errorf("%w: %s: want a string", ErrBadChat, key)
}

// deleteKey removes key from d, keeping the order of the others.
func deleteKey(d *jinja.Dict, key string) {
	if _, ok := d.Data[key]; !ok {
		return
	}
	delete(d.Data, key)
	for i, k := range d.Keys {
		if k == key {
			d.Keys = append(d.Keys[:i:i], d.Keys[i+1:]...)
			break
		}
	}
}

// maxJSONDepth bounds nesting so hostile input cannot recurse without end
// (Python's json gives up near 1000 levels too).
const maxJSONDepth = 512

// decodeJSONValue decodes one JSON document into template values, keeping
// object key order (the order tojson prints) and the int/float distinction
// Python's json keeps (1 vs 1.0). field names the input in errors.
func decodeJSONValue(data []byte, field string) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeValue(dec, 0)
	if err == nil {
		if _, e := dec.Token(); e != io.EOF {
			err = fmt.Errorf("%w: trailing data", ErrBadChat)
		}
	}
	if err != nil {
		if !errors.Is(err, ErrBadChat) && !errors.Is(err, ErrUnsupported) {
			err = fmt.Errorf("%w: %v", ErrBadChat, err)
		}
		return jinja.Undefined(), fmt.Errorf("%s: %w", field, err)
	}
	return v, nil
}

func decodeValue(dec *json.Decoder, depth int) (jinja.Value, error) {
	if depth > maxJSONDepth {
		return jinja.Undefined(), fmt.Errorf("%w: nested deeper than %d", ErrBadChat, maxJSONDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return jinja.Undefined(), err
	}
	switch t := tok.(type) {
	case nil:
		return jinja.None(), nil
	case bool:
		return jinja.NewBool(t), nil
	case string:
		return jinja.NewString(t), nil
	case json.Number:
		return numberValue(string(t))
	case json.Delim:
		if t == '[' {
			items := []jinja.Value{}
			for dec.More() {
				v, err := decodeValue(dec, depth+1)
				if err != nil {
					return jinja.Undefined(), err
				}
				items = append(items, v)
			}
			_, err := dec.Token()
			return jinja.NewList(items), err
		}
		obj := jinja.NewDict()
		d := obj.AsDict()
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return jinja.Undefined(), err
			}
			v, err := decodeValue(dec, depth+1)
			if err != nil {
				return jinja.Undefined(), err
			}
			d.Set(k.(string), v) // a later duplicate key wins in place, as in Python
		}
		_, err := dec.Token()
		return obj, err
	}
	return jinja.Undefined(), fmt.Errorf("%w: unexpected token %v", ErrBadChat, tok)
}

// numberValue keeps Python's distinction: no '.', 'e' or 'E' is an int.
func numberValue(s string) (jinja.Value, error) {
	if !strings.ContainsAny(s, ".eE") {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return jinja.Undefined(), fmt.Errorf("%w: integer %s beyond int64", ErrUnsupported, s)
		}
		return jinja.NewInt(n), nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		// Python's json.loads turns overflowing floats into inf; tojson
		// would print Infinity. Rare enough to leave to the engine.
		return jinja.Undefined(), fmt.Errorf("%w: number %s out of float64 range", ErrUnsupported, s)
	}
	return jinja.NewFloat(f), nil
}

// strftimeNow implements transformers' strftime_now(format): the current
// local time formatted with Python's (glibc's) strftime directives,
// including the glibc "-" flag that drops padding (%-d).
func strftimeNow(now func() time.Time) func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
	return func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) != 1 || !args[0].IsString() {
			return jinja.Undefined(), errors.New("strftime_now: want one format string")
		}
		return jinja.NewString(strftime(args[0].AsString(), now())), nil
	}
}

func strftime(format string, t time.Time) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		if format[i] != '%' || i+1 == len(format) {
			b.WriteByte(format[i])
			continue
		}
		i++
		pad := true
		if format[i] == '-' && i+1 < len(format) {
			pad = false
			i++
		}
		num := func(n, width int) {
			s := strconv.Itoa(n)
			if pad {
				s = strings.Repeat("0", max(0, width-len(s))) + s
			}
			b.WriteString(s)
		}
		switch format[i] {
		case 'a':
			b.WriteString(t.Format("Mon"))
		case 'A':
			b.WriteString(t.Format("Monday"))
		case 'b', 'h':
			b.WriteString(t.Format("Jan"))
		case 'B':
			b.WriteString(t.Format("January"))
		case 'd':
			num(t.Day(), 2)
		case 'e':
			if pad {
				fmt.Fprintf(&b, "%2d", t.Day())
			} else {
				num(t.Day(), 0)
			}
		case 'm':
			num(int(t.Month()), 2)
		case 'y':
			num(t.Year()%100, 2)
		case 'Y':
			num(t.Year(), 0)
		case 'H':
			num(t.Hour(), 2)
		case 'I':
			num((t.Hour()+11)%12+1, 2)
		case 'p':
			b.WriteString(t.Format("PM"))
		case 'M':
			num(t.Minute(), 2)
		case 'S':
			num(t.Second(), 2)
		case 'f':
			num(t.Nanosecond()/1000, 6)
		case 'j':
			num(t.YearDay(), 3)
		case 'w':
			num(int(t.Weekday()), 0)
		case 'z':
			b.WriteString(t.Format("-0700"))
		case 'Z':
			b.WriteString(t.Format("MST"))
		case 'F':
			b.WriteString(t.Format("2006-01-02"))
		case 'T':
			b.WriteString(t.Format("15:04:05"))
		case '%':
			b.WriteByte('%')
		default: // glibc prints unknown directives as written
			b.WriteByte('%')
			if !pad {
				b.WriteByte('-')
			}
			b.WriteByte(format[i])
		}
	}
	return b.String()
}
