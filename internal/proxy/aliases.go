package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"time"

	"kvrouter/internal/admission"
	"kvrouter/internal/config"
	"kvrouter/internal/request"
)

// Route aliases.
//
// An alias is a client-facing model name over a model group: its requests
// are served by the group's engines and routed with the group's index, with
// request defaults and caps applied first, so that one engine fleet offers,
// say, a fast route with thinking off and a thorough one with thinking on.
// The rewritten body is what is tokenized, keyed and forwarded: with
// chat_template_kwargs {"enable_thinking": false} the Qwen3 template renders
// an empty think block into the prompt, so the keys follow the tokens the
// engine computes. vLLM fields: chat_template_kwargs (merged into the chat
// template's variables, vllm/entrypoints/openai/chat_completion/
// protocol.py), thinking_token_budget (vllm/sampling_params.py
// SamplingParams; the engine needs a reasoning parser for it), max_tokens
// and max_completion_tokens. With StripReasoning, reasoning_content (and
// its newer name reasoning) is removed from every choice's message and
// delta before the answer reaches the client; kvrouter never logs response
// bodies.

// alias returns the alias called name and its group, or nil
// (admission.Core.Alias).
func (s *Server) alias(name string) (*config.Alias, *model) {
	if al, g := s.core.Alias(name); al != nil {
		return al, s.models[g.Cfg.Name]
	}
	return nil, nil
}

// aliasFeature is a group's route aliases: a request naming an alias is
// rewritten for the base model (rewrite), its answer filtered (hooks.filter)
// and its series recorded at its end (hooks.end).
type aliasFeature struct{ s *Server }

// Admit does nothing: an alias is served by Rewrite.
func (aliasFeature) Admit(context.Context, *admission.Flow) *request.Error { return nil }

// Rewrite rewrites the body of a request for an alias and parses it again;
// other requests are returned as they are.
func (f aliasFeature) Rewrite(_ context.Context, _ *admission.Flow, g *admission.Group, req *request.Parsed, body []byte) (*request.Parsed, *request.Error) {
	al := g.Alias(req.Model)
	if al == nil {
		return req, nil
	}
	out, err := rewriteAlias(al, body, g.Cfg.Name, req.Kind == request.Chat)
	if err != nil {
		return nil, request.Invalid("", err.Error())
	}
	return request.Parse(req.Kind, out)
}

// plug filters the answer of a request for an alias and records its
// series at its end.
func (f aliasFeature) plug(_ context.Context, x *exchange, m *model) {
	al := m.Alias(x.Asked)
	if al == nil {
		return
	}
	u := &aliasUse{al: al}
	x.hooks.filter = u.filter
	x.hooks.addEnd(func(x *exchange, attrs []slog.Attr) []slog.Attr {
		f.s.observeRoute(x, u)
		return attrs
	})
}

// aliasUse is one request's use of an alias: what its answer reported.
type aliasUse struct {
	al    *config.Alias
	usage routeUsage
}

// rewriteAlias returns body with model set to base and alias a's defaults and
// caps applied. body is a valid JSON object (request.Parse checked it).
func rewriteAlias(a *config.Alias, body []byte, base string, chat bool) ([]byte, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil {
		return nil, err
	}
	set := func(key string, v any) {
		b, _ := json.Marshal(v) // ints, strings, JSON values from yaml
		obj[key] = b
	}
	present := func(key string) bool { v, ok := obj[key]; return ok && !isNull(v) }
	intOf := func(key string) (int, error) { // as the engine reads it
		n, ok := request.LaxInt(obj[key])
		if !ok {
			return 0, fmt.Errorf("%s: want an integer", key)
		}
		return n, nil
	}
	set("model", base)
	if chat && len(a.ChatTemplateKwargs) > 0 {
		kw := map[string]json.RawMessage{}
		if present("chat_template_kwargs") {
			if err := json.Unmarshal(obj["chat_template_kwargs"], &kw); err != nil {
				return nil, fmt.Errorf("chat_template_kwargs: want an object")
			}
		}
		for key, v := range a.ChatTemplateKwargs {
			b, err := json.Marshal(v)
			if err != nil {
				return nil, err
			}
			kw[key] = b
		}
		set("chat_template_kwargs", kw)
	}
	if b := a.ThinkingTokenBudget; b != nil {
		if !present("thinking_token_budget") {
			set("thinking_token_budget", *b)
		} else if n, err := intOf("thinking_token_budget"); err != nil {
			return nil, err
		} else if n > *b {
			set("thinking_token_budget", *b)
		}
	}
	keys := []string{"max_tokens"}
	if chat {
		keys = append(keys, "max_completion_tokens")
	}
	has := slices.ContainsFunc(keys, present)
	if !has && a.MaxTokens > 0 {
		set("max_tokens", a.MaxTokens)
		has = true
	}
	if c := a.MaxTokensCap; c > 0 {
		if !has {
			set("max_tokens", c)
		}
		for _, key := range keys {
			if !present(key) {
				continue
			}
			n, err := intOf(key)
			if err != nil {
				return nil, err
			}
			if n > c {
				set(key, c)
			}
		}
	}
	return json.Marshal(obj)
}

// routeUsage is what a route's answers reported in usage, in tokens.
type routeUsage struct {
	prompt, reasoning, cached int
	seen                      bool
}

// reasoningKeys are the fields vLLM's reasoning parsers fill: reasoning_content
// (vLLM before 0.11) and reasoning.
var reasoningKeys = []string{"reasoning_content", "reasoning"}

// filter is the response transform of a route alias: for each JSON object
// in b (a whole non-streaming body, or whole events' "data:" lines) it
// reads usage and, with StripReasoning, removes the reasoning fields of
// every choice. Other bytes pass unchanged.
func (u *aliasUse) filter(b []byte) []byte {
	a := u.al
	t := bytes.TrimSpace(b)
	if len(t) > 0 && t[0] == '{' {
		return u.filterJSON(b, a.StripReasoning)
	}
	var out []byte
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		line := b
		if i >= 0 {
			line, b = b[:i+1], b[i+1:]
		} else {
			b = nil
		}
		if data, ok := bytes.CutPrefix(line, dataField); ok {
			sp := len(data) > 0 && data[0] == ' '
			if sp {
				data = data[1:]
			}
			end := bytes.TrimRight(data, "\r\n")
			if len(end) > 0 && end[0] == '{' {
				out = append(out, dataField...)
				if sp {
					out = append(out, ' ')
				}
				out = append(out, u.filterJSON(end, a.StripReasoning)...)
				out = append(out, data[len(end):]...)
				continue
			}
		}
		out = append(out, line...)
	}
	return out
}

// filterJSON handles one JSON object: usage, then the reasoning fields.
func (u *aliasUse) filterJSON(b []byte, strip bool) []byte {
	hasUsage := bytes.Contains(b, []byte(`"usage"`))
	hasReasoning := strip && bytes.Contains(b, []byte(`"reasoning`))
	if !hasUsage && !hasReasoning {
		return b
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(b, &obj) != nil {
		return b
	}
	if raw, ok := obj["usage"]; ok && !isNull(raw) {
		var us struct {
			Prompt        int `json:"prompt_tokens"`
			PromptDetails *struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
			CompletionDetails *struct {
				Reasoning int `json:"reasoning_tokens"`
			} `json:"completion_tokens_details"`
		}
		if json.Unmarshal(raw, &us) == nil {
			u.usage.seen = true
			u.usage.prompt += us.Prompt
			if us.PromptDetails != nil {
				u.usage.cached += us.PromptDetails.Cached
			}
			if us.CompletionDetails != nil {
				u.usage.reasoning += us.CompletionDetails.Reasoning
			}
		}
	}
	if !hasReasoning {
		return b
	}
	var choices []map[string]json.RawMessage
	if json.Unmarshal(obj["choices"], &choices) != nil {
		return b
	}
	for _, c := range choices {
		for _, part := range []string{"message", "delta"} {
			var m map[string]json.RawMessage
			if json.Unmarshal(c[part], &m) != nil || m == nil {
				continue
			}
			for _, k := range reasoningKeys {
				delete(m, k)
			}
			c[part], _ = json.Marshal(m)
		}
	}
	obj["choices"], _ = json.Marshal(choices)
	out, err := json.Marshal(obj)
	if err != nil {
		return b
	}
	return out
}

// observeRoute records an alias request's series at its end.
func (s *Server) observeRoute(x *exchange, u *aliasUse) {
	r := u.al.Name
	s.fm.routeRequests.WithLabelValues(r, x.outcome).Inc()
	if u.usage.seen {
		s.fm.routeTokens.WithLabelValues(r, "prompt").Add(float64(u.usage.prompt))
		s.fm.routeTokens.WithLabelValues(r, "cached").Add(float64(u.usage.cached))
		s.fm.routeTokens.WithLabelValues(r, "reasoning").Add(float64(u.usage.reasoning))
	}
}

// maxFilteredBody bounds a non-streaming answer read whole to be filtered.
const maxFilteredBody = 64 << 20

// copyFiltered reads a non-event body whole (at most maxFilteredBody; a
// longer one is relayed unfiltered from there), filters it and writes it.
func copyFiltered(x *exchange, wd *watchdog, body io.Reader, firstToken func()) error {
	b, err := io.ReadAll(io.LimitReader(body, maxFilteredBody))
	wd.progress(time.Now())
	if err != nil {
		return err
	}
	firstToken()
	if len(b) < maxFilteredBody {
		b = x.hooks.filter(b)
	}
	if _, werr := x.w.Write(b); werr != nil {
		return &writeError{werr}
	}
	if len(b) >= maxFilteredBody {
		_, err = io.Copy(x.w, body)
	}
	return err
}
