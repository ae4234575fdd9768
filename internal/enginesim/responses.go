package enginesim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
)

// The Responses API (POST /v1/responses), modelled on vLLM
// (vllm/entrypoints/openai/responses/: protocol.py ResponsesRequest,
// serving.py, utils.py construct_input_messages, api_router.py):
//
//   - The prompt is a chat: "instructions" as a system message first (when
//     not empty), then with previous_response_id the stored conversation
//     (its system messages left out) and the stored response's output
//     text as an assistant message, then the input: a string as one user
//     message, or message items ({"role", "content"}, "type" absent or
//     "message"; content a string or input_text/output_text parts; an
//     assistant item keeps its first part's text). It is rendered by the
//     Tokenizer's chat template with the generation prompt. Other item
//     types (function calls, reasoning, images) are a 400 here, a
//     simplification.
//   - The response's id is the body's request_id, default "resp_" + a
//     random id. With Config.ResponsesStore (vLLM:
//     VLLM_ENABLE_RESPONSES_API_STORE=1) and store (default true), the
//     conversation and output are kept in this API server's memory, shared
//     by its data-parallel ranks and lost at Restart. An unknown
//     previous_response_id is vLLM's 404: "Response with id '<id>' not
//     found.", type invalid_request_error, param response_id.
//   - usage: input_tokens, input_tokens_details.cached_tokens,
//     output_tokens, output_tokens_details.reasoning_tokens, total_tokens.
//   - stream: events "event: <type>\ndata: <json>\n\n": response.created,
//     one response.output_text.delta per token, response.completed (the
//     whole response); no [DONE].

// responsesStore holds stored responses by id. Safe for concurrent use.
type responsesStore struct {
	mu sync.Mutex
	m  map[string]storedResponse
}

// storedResponse is one stored response: the chat it answered and its
// output text.
type storedResponse struct {
	messages []json.RawMessage
	output   string
}

func (st *responsesStore) get(id string) (storedResponse, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	r, ok := st.m[id]
	return r, ok
}

func (st *responsesStore) put(id string, r storedResponse) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.m == nil {
		st.m = map[string]storedResponse{}
	}
	st.m[id] = r
}

func (st *responsesStore) clear() {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.m = nil
}

// responsesRequest is the part of a Responses body the simulator reads.
type responsesRequest struct {
	Model        string          `json:"model"`
	Input        json.RawMessage `json:"input"`
	Instructions string          `json:"instructions"`
	PrevID       string          `json:"previous_response_id"`
	Store        *bool           `json:"store"`
	Stream       bool            `json:"stream"`
	MaxOutput    *int            `json:"max_output_tokens"`
	RequestID    string          `json:"request_id"`
	CacheSalt    *string         `json:"cache_salt"`
	VLLMXArgs    map[string]any  `json:"vllm_xargs"`
}

// responsesInput converts the input to chat messages.
func responsesInput(raw json.RawMessage) ([]json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, fmt.Errorf("input is required")
	}
	msg := func(role, content string) json.RawMessage {
		b, _ := json.Marshal(map[string]string{"role": role, "content": content})
		return b
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []json.RawMessage{msg("user", s)}, nil
	}
	var items []struct {
		Type    *string         `json:"type"`
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("input must be a string or a list of input items")
	}
	var out []json.RawMessage
	for i, it := range items {
		if it.Type != nil && *it.Type != "message" || it.Role == "" {
			return nil, fmt.Errorf("input[%d]: only message items are simulated", i)
		}
		var text string
		if json.Unmarshal(it.Content, &text) != nil {
			var parts []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			}
			if json.Unmarshal(it.Content, &parts) != nil || len(parts) == 0 {
				return nil, fmt.Errorf("input[%d].content must be a string or a list of text parts", i)
			}
			if it.Role == "assistant" {
				text = parts[0].Text
			} else {
				conv := make([]map[string]string, len(parts))
				for j, p := range parts {
					if p.Type != "input_text" && p.Type != "output_text" && p.Type != "text" {
						return nil, fmt.Errorf("input[%d].content[%d]: only text parts are simulated", i, j)
					}
					conv[j] = map[string]string{"type": "text", "text": p.Text}
				}
				b, _ := json.Marshal(map[string]any{"role": it.Role, "content": conv})
				out = append(out, b)
				continue
			}
		}
		out = append(out, msg(it.Role, text))
	}
	return out, nil
}

// serveResponses handles POST /v1/responses on the rank the request names
// or the least loaded one (dp.go).
func (s *Server) serveResponses(w http.ResponseWriter, r *http.Request) {
	rs, msg := s.rankFor(r.Header.Get(RankHeader))
	if msg != "" {
		writeError(w, http.StatusBadRequest, msg)
		return
	}
	body, ok := rs.readBody(w, r)
	if !ok {
		return
	}
	var req responsesRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	lora, ok := rs.loraFor(req.Model)
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", req.Model))
		return
	}
	var msgs []json.RawMessage
	if req.Instructions != "" {
		b, _ := json.Marshal(map[string]string{"role": "system", "content": req.Instructions})
		msgs = append(msgs, b)
	}
	if req.PrevID != "" {
		prev, ok := s.store.get(req.PrevID)
		if !ok {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			p := "response_id"
			_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
				"message": fmt.Sprintf("Response with id '%s' not found.", req.PrevID),
				"type":    "invalid_request_error", "param": &p, "code": http.StatusNotFound}})
			return
		}
		for _, m := range prev.messages {
			var role struct {
				Role string `json:"role"`
			}
			if json.Unmarshal(m, &role) == nil && role.Role != "system" {
				msgs = append(msgs, m)
			}
		}
		b, _ := json.Marshal(map[string]string{"role": "assistant", "content": prev.output})
		msgs = append(msgs, b)
	}
	in, err := responsesInput(req.Input)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	msgs = append(msgs, in...)
	chat, _ := json.Marshal(map[string]any{"messages": msgs, "add_generation_prompt": true})
	prompt, err := rs.tok.EncodeChat(chat)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if m := rs.checkPrompt(prompt); m != "" {
		writeError(w, http.StatusBadRequest, m)
		return
	}
	gr := &genRequest{Model: req.Model, MaxTokens: req.MaxOutput, CacheSalt: req.CacheSalt, VLLMXArgs: req.VLLMXArgs}
	mt, m := rs.maxTokens(gr, true, len(prompt))
	if m != "" {
		writeError(w, http.StatusBadRequest, m)
		return
	}
	id := req.RequestID
	if id == "" {
		id = newID("resp_")
	}
	salt := ""
	if req.CacheSalt != nil {
		salt = *req.CacheSalt
	}
	notify := make(chan struct{}, 1)
	st := newStream(id+"_0", notify)
	sub := submission{st: st, req: Request{ID: st.id, Tokens: prompt, MaxTokens: mt, LoRAName: lora, CacheSalt: salt, ReportHits: gr.reportHits()}}
	if err := rs.eng.send(r.Context(), command{submit: []submission{sub}, reply: make(chan error, 1)}); err != nil {
		rs.eng.abort([]string{st.id})
		if r.Context().Err() == nil {
			writeError(w, http.StatusInternalServerError, err.Error())
		}
		return
	}
	c := &choiceState{st: st}
	defer func() {
		if !c.done {
			rs.eng.abort([]string{st.id})
		}
	}()
	o := &responder{s: rs, w: w, r: r, req: gr, chat: true, id: id, choices: []*choiceState{c}, prompts: [][]uint32{prompt}, notify: notify}
	out := &responsesOut{o: o, req: &req, msgID: newID("msg_"), created: rs.cfg.Clock.Now().Unix()}
	if !out.run() {
		return
	}
	if (req.Store == nil || *req.Store) && s.cfg.ResponsesStore {
		s.store.put(id, storedResponse{messages: msgs, output: c.text.String()})
	}
}

// responsesOut writes one Responses answer, whole or streamed.
type responsesOut struct {
	o       *responder
	req     *responsesRequest
	msgID   string
	created int64
	seq     int
}

// response is the response object in its current state.
func (a *responsesOut) response(status string) map[string]any {
	c := a.o.choices[0]
	output := []any{}
	if status == "completed" {
		output = append(output, map[string]any{"id": a.msgID, "type": "message", "role": "assistant", "status": "completed",
			"content": []any{map[string]any{"type": "output_text", "text": c.text.String(), "annotations": []any{}}}})
	}
	u := a.o.usage()
	cached := 0
	if u.PromptTokensDetails != nil {
		cached = u.PromptTokensDetails.CachedTokens
	}
	var prev any
	if a.req.PrevID != "" {
		prev = a.req.PrevID
	}
	return map[string]any{"id": a.o.id, "object": "response", "created_at": a.created, "model": a.o.model(),
		"status": status, "output": output, "previous_response_id": prev,
		"usage": map[string]any{"input_tokens": u.PromptTokens, "input_tokens_details": map[string]any{"cached_tokens": cached},
			"output_tokens": u.CompletionTokens, "output_tokens_details": map[string]any{"reasoning_tokens": 0}, "total_tokens": u.TotalTokens}}
}

// event appends one named event to sb.
func (a *responsesOut) event(sb *strings.Builder, typ string, fields map[string]any) {
	fields["type"], fields["sequence_number"] = typ, a.seq
	a.seq++
	b, _ := json.Marshal(fields)
	sb.WriteString("event: " + typ + "\ndata: ")
	sb.Write(b)
	sb.WriteString("\n\n")
}

// run writes the answer; false when it did not complete (client gone).
func (a *responsesOut) run() bool {
	o := a.o
	var sb strings.Builder
	var rc *http.ResponseController
	if a.req.Stream {
		h := o.w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		o.w.WriteHeader(http.StatusOK)
		rc = http.NewResponseController(o.w)
		a.event(&sb, "response.created", map[string]any{"response": a.response("in_progress")})
	}
	for {
		err := o.collect(func(c *choiceState, _ int, tok uint32, _ bool) {
			t := o.s.words.token(tok)
			c.text.WriteString(t)
			if a.req.Stream {
				a.event(&sb, "response.output_text.delta", map[string]any{"item_id": a.msgID, "output_index": 0, "content_index": 0, "delta": t})
			}
		})
		if err != nil {
			panic(http.ErrAbortHandler) // the engine died: the connection drops
		}
		if o.allDone() {
			break
		}
		if a.req.Stream && !o.flush(rc, &sb) || !o.wait() {
			return false
		}
	}
	if !a.req.Stream {
		writeJSON(o.w, a.response("completed"))
		return true
	}
	a.event(&sb, "response.completed", map[string]any{"response": a.response("completed")})
	return o.flush(rc, &sb)
}
