package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
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
	// reproduce exactly (multimodal content parts, a template computing with
	// an integer beyond int64, see bigint.go); ask the engine's render
	// endpoint instead.
	ErrUnsupported = errors.New("not supported by the local renderer")
	// ErrBadChat: the chat request is malformed (bad JSON, wrong types,
	// unparsable tool-call arguments); vLLM answers such requests with 400.
	ErrBadChat = errors.New("malformed chat request")
	// ErrTooManyValues: the chat body holds more than MaxJSONValues JSON
	// values. Each decoded value costs about 150 bytes against one or two
	// bytes of input, so the bound keeps a body within body_limit from
	// taking gigabytes to decode; the router answers 400 without decoding
	// the body another way.
	ErrTooManyValues = fmt.Errorf("more than %d JSON values", MaxJSONValues)
)

// MaxJSONValues bounds the JSON values (objects, arrays, strings, numbers,
// literals) one chat body may hold: far above any chat (a 100K-token
// conversation with tools holds a few thousand), far below a body of
// numbers at body_limit.
const MaxJSONValues = 1 << 18

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
	// ContinueFinalMessage (vLLM) leaves the last message open. The local
	// renderer does not reproduce it: Render returns ErrUnsupported.
	ContinueFinalMessage bool `json:"continue_final_message,omitempty"`
	// ChatTemplate (vLLM) replaces the model's template for this request.
	// The local renderer does not take it: Render returns ErrUnsupported.
	ChatTemplate string `json:"chat_template,omitempty"`

	// pre holds the fields above already decoded (Document.ChatRequest);
	// nil: the renderer decodes them.
	pre *preDecoded
}

// UnmarshalJSON decodes a chat request body, defaulting
// add_generation_prompt to true as vLLM's ChatCompletionRequest does.
func (r *ChatRequest) UnmarshalJSON(data []byte) error {
	type plain ChatRequest
	p := plain{AddGenerationPrompt: true}
	if bytes.Equal(bytes.TrimSpace(data), []byte("null")) {
		return fmt.Errorf("%w: want %s, got null", ErrBadChat, chatShape)
	}
	if err := json.Unmarshal(data, &p); err != nil {
		return fmt.Errorf("%w: %v", ErrBadChat, chatJSONError(data, err))
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
	// sources are the template texts, which placeholders for integers
	// beyond int64 must not occur in.
	sources []string
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
	c.sources = sources
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
	if req.ContinueFinalMessage || req.ChatTemplate != "" {
		return "", fmt.Errorf("%w: continue_final_message or a request chat_template", ErrUnsupported)
	}
	ints := &bigInts{}
	if req.pre != nil {
		ints = req.pre.ints // what decoding the document collected
	}
	vars, err := c.vars(req, ints)
	if err != nil {
		return "", err
	}
	t, err := c.pick(vars["tools"].IsTruthy())
	if err != nil {
		return "", err
	}
	if len(ints.seen) > 0 {
		return c.renderBig(t, req, ints)
	}
	return render(t, vars)
}

// renderBig renders a chat holding integers beyond int64 (collected in
// ints) twice, with two placeholder sets, restores their digits and checks
// that both renderings agree (bigint.go).
func (c *ChatTemplate) renderBig(t *jinja.Template, req ChatRequest, ints *bigInts) (string, error) {
	avoid := append([]string{string(req.Messages), string(req.Tools), string(req.ChatTemplateKwargs),
		c.bos.String(), c.eos.String()}, c.sources...)
	rng := rand.New(rand.NewPCG(0x6b7672, uint64(len(ints.seen)))) // fixed: the same request, the same placeholders
	taken := map[int64]bool{}
	var outs [2]string
	for i := range outs {
		subst, err := placeholders(ints, avoid, taken, rng)
		if err != nil {
			return "", err
		}
		for _, p := range subst {
			taken[max(p, -p)] = true
		}
		vars, err := c.vars(req, &bigInts{subst: subst})
		if err != nil {
			return "", err
		}
		out, err := render(t, vars)
		if err != nil {
			return "", err
		}
		outs[i] = restorer(subst).Replace(out)
	}
	if outs[0] != outs[1] {
		return "", fmt.Errorf("%w: the chat template computes with an integer beyond int64", ErrUnsupported)
	}
	return outs[0], nil
}

// render runs t on vars.
func render(t *jinja.Template, vars map[string]jinja.Value) (out string, err error) {
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
// request kwargs last), then messages. Integers beyond int64 go through
// ints. A request decoded with its Document (req.pre) is read from there,
// unless ints substitutes placeholders (renderBig), which takes a fresh
// decode.
func (c *ChatTemplate) vars(req ChatRequest, ints *bigInts) (map[string]jinja.Value, error) {
	var pre preDecoded // all Undefined: decode
	if req.pre != nil && ints.subst == nil {
		pre = *req.pre
	}
	msgs, err := decoded(pre.messages, req.Messages, "messages", ints)
	if err != nil {
		return nil, err
	}
	if !msgs.IsList() {
		return nil, fmt.Errorf("%w: messages: want a list", ErrBadChat)
	}
	if msgs, err = normalizeMessages(msgs.AsList(), c.format, ints); err != nil {
		return nil, err
	}
	tools := jinja.None()
	if t := bytes.TrimSpace(req.Tools); len(t) > 0 && string(t) != "null" {
		if tools, err = decoded(pre.tools, t, "tools", ints); err != nil {
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
		kw, err := decoded(pre.kwargs, k, "chat_template_kwargs", ints)
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

// Local renders chats with a model's compiled template and encodes them
// with its tokenizer: the exact, in-process way to get the ids vLLM will
// compute. It is immutable and safe for concurrent use.
type Local struct {
	tok     *Tokenizer
	tmpl    *ChatTemplate // nil when the model has no chat template
	tmplErr error         // why tmpl is nil
	cache   *PrefixCache  // nil: chats are encoded in full
}

// NewLocal compiles tok's chat template (from tokenizer_config.json) once.
// A model without a chat template is not an error: EncodeChat then returns
// ErrNoChatTemplate. A template that does not compile is.
func NewLocal(tok *Tokenizer, format ContentFormat) (*Local, error) {
	cfg := tok.Config()
	tmpl, err := NewChatTemplate(ChatTemplateConfig{
		Source: cfg.ChatTemplate, BOSToken: cfg.BOSToken, EOSToken: cfg.EOSToken, ContentFormat: format,
	})
	if err != nil && !errors.Is(err, ErrNoChatTemplate) {
		return nil, err
	}
	return &Local{tok: tok, tmpl: tmpl, tmplErr: err}, nil
}

// WithPrefixCache returns a Local like l whose EncodeChat takes the ids of
// rendered prefixes it has seen from c (prefixcache.go): the same ids,
// computed only for what follows the longest cached prefix. A nil c
// encodes every chat in full. The ids EncodeChat returns may then share
// their array with the cache: callers must not modify them (appending is
// safe).
func (l *Local) WithPrefixCache(c *PrefixCache) *Local {
	cp := *l
	cp.cache = c
	return &cp
}

// Encode returns the ids of a plain prompt (see Tokenizer.Encode).
func (l *Local) Encode(text string, addSpecialTokens bool) []uint32 {
	return l.tok.Encode(text, addSpecialTokens)
}

// Decode returns the text of ids (see Tokenizer.Decode).
func (l *Local) Decode(ids []uint32) string { return l.tok.Decode(ids) }

// EncodeChat renders req and encodes the text with add_special_tokens=false,
// as vLLM does for chat requests (the template writes the special tokens).
// Errors are Render's.
func (l *Local) EncodeChat(req ChatRequest) (text string, ids []uint32, err error) {
	text, ids, _, err = l.encodeChat(req)
	return text, ids, err
}

// encodeChat is EncodeChat with the prompt's PrefixMemo (nil without a
// prefix cache).
func (l *Local) encodeChat(req ChatRequest) (text string, ids []uint32, memo *PrefixMemo, err error) {
	if l.tmpl == nil {
		return "", nil, nil, l.tmplErr
	}
	if text, err = l.tmpl.Render(req); err != nil {
		return "", nil, nil, err
	}
	ids, memo = l.tok.encodeCached(text, l.cache)
	return text, ids, memo, nil
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
